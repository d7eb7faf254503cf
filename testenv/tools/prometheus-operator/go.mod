// Pins the Prometheus Operator release whose CRDs (ServiceMonitor,
// PrometheusRule) the chart's monitoring objects are checked against.
// Nothing here is built: only the module's source is read.
module node-holder.dev/testenv/tools/prometheus-operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
