{{/* The chart's short name. */}}
{{- define "node-holder.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the release name when it holds the chart name. */}}
{{- define "node-holder.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "node-holder.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "node-holder.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with include "node-holder.additionalLabels" . }}
{{ . }}
{{- end }}
{{- end }}

{{/*
additionalLabels as YAML, without the keys the chart sets itself (the values
schema refuses those; this keeps a render without the schema valid).
*/}}
{{- define "node-holder.additionalLabels" -}}
{{- with omit .Values.additionalLabels "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "node-holder.selectorLabels" -}}
app.kubernetes.io/name: {{ include "node-holder.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
node-holder's ServiceAccount: the chart's (the full name unless named), or
one of yours, which must then be named.
*/}}
{{- define "node-holder.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "node-holder.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required with serviceAccount.create=false: the ServiceAccount of yours the chart binds node-holder's RBAC to" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
node-holder's image: the Deployment's, and the hooks' too.
`[registry/]repository@digest` when a digest is given (it wins over the tag),
else `[registry/]repository:tag` (the tag defaults to the appVersion).
*/}}
{{- define "node-holder.image" -}}
{{- $repository := required "image.repository is required: the repository you pushed node-holder's image to, with its registry or with image.registry (it is not published anywhere by default)" .Values.image.repository }}
{{- with .Values.image.registry }}
{{- $repository = printf "%s/%s" . $repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
The pod spec's fields every pod of the chart shares (the Deployment's, the
`helm test` Pod's and the pre-delete Job's): priority, pull secrets, the
pod's securityContext and the placement (nodeSelector, tolerations,
affinity), so that the hooks run wherever the replicas can and never stay
Pending on a cluster where node-holder runs.
*/}}
{{- define "node-holder.podCommon" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
  {{- include "node-holder.affinity" . | trim | nindent 2 }}
{{- end }}

{{/*
The pods' affinity: the given one, else the replicas' hosts avoided where
possible and, with avoidKarpenterNodes, Karpenter's nodes always.
*/}}
{{- define "node-holder.affinity" -}}
{{- if .Values.affinity }}
{{- toYaml .Values.affinity }}
{{- else }}
{{- if .Values.avoidKarpenterNodes }}
# Off the nodes Karpenter manages, which it may take away: node-holder
# holds them, it should not depend on them.
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: karpenter.sh/nodepool
            operator: DoesNotExist
{{- end }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "node-holder.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end }}

{{/*
The container fields every container of the chart shares: its resources and
its securityContext (non-root, read-only root, no privilege escalation, no
capabilities; fixed).
*/}}
{{- define "node-holder.containerCommon" -}}
{{- with .Values.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/*
The holds as `serve` reads them (--hold-preset, --hold-annotation), for the
Deployment's container and `self-check`'s alike.
*/}}
{{- define "node-holder.holdEnv" -}}
{{- with .Values.config.holdPresets }}
- name: NODE_HOLDER_HOLD_PRESETS
  value: {{ join "," . | quote }}
{{- end }}
{{- with .Values.config.holdAnnotations }}
- name: NODE_HOLDER_HOLD_ANNOTATIONS
  value: {{ include "node-holder.keyValues" . | quote }}
{{- end }}
{{- end }}

{{/* The Secret holding the serving certificate. */}}
{{- define "node-holder.tlsSecretName" -}}
{{- if eq .Values.tls.mode "provided" }}
{{- required "tls.provided.secretName is required when tls.mode=provided" .Values.tls.provided.secretName }}
{{- else }}
{{- printf "%s-tls" (include "node-holder.fullname" .) }}
{{- end }}
{{- end }}

{{/* The Service's DNS names, as the API server verifies them. */}}
{{- define "node-holder.dnsNames" -}}
- {{ printf "%s.%s.svc" (include "node-holder.fullname" .) .Release.Namespace }}
- {{ printf "%s.%s.svc.%s" (include "node-holder.fullname" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{- define "node-holder.validate" -}}
{{- if not (has .Values.admission.mode (list "auto" "webhook" "policy")) }}
{{- fail (printf "admission.mode must be auto, webhook or policy, not %q" .Values.admission.mode) }}
{{- end }}
{{- if not (include "node-holder.policyMode" .) }}
{{- if not (has .Values.tls.mode (list "certManager" "provided")) }}
{{- fail (printf "tls.mode must be certManager or provided, not %q" .Values.tls.mode) }}
{{- end }}
{{- if eq .Values.tls.mode "provided" }}
{{- $_ := required "tls.provided.caBundle (base64 PEM CA) is required when tls.mode=provided" .Values.tls.provided.caBundle }}
{{- end }}
{{- end }}
{{- with .Values.config.clientCA }}
{{- if and .secretName .configMapName }}
{{- fail "config.clientCA: set secretName or configMapName, not both" }}
{{- end }}
{{- if and (or .secretName .configMapName) (not .key) }}
{{- fail "config.clientCA.key (the key holding the PEM CA) is required with config.clientCA" }}
{{- end }}
{{- end }}
{{- $timeout := int .Values.webhook.timeoutSeconds }}
{{- if or (lt $timeout 1) (gt $timeout 30) }}
{{- fail "webhook.timeoutSeconds must be between 1 and 30 (keep it small: 1-5)" }}
{{- end }}
{{- include "node-holder.validateCluster" . }}
{{- end }}

{{/*
What the values ask of the cluster, checked against the APIs it serves
(`.Capabilities.APIVersions`: the cluster's own at `helm install` and
`helm upgrade`; with `helm template`, the built-in APIs and those given with
--api-versions): a clear message at render time instead of an object the API
server cannot map, or pods that can never be scheduled.
*/}}
{{- define "node-holder.validateCluster" -}}
{{- $apis := .Capabilities.APIVersions }}
{{- $offline := "(helm template without a cluster: pass --api-versions %s)" }}
{{- if and (eq .Values.tls.mode "certManager") (not (include "node-holder.policyMode" .)) (not ($apis.Has "cert-manager.io/v1/Certificate")) }}
{{- fail (printf "tls.mode=certManager, but this cluster does not serve cert-manager.io/v1 Certificate: install cert-manager (with its CRDs) first, or use tls.mode=provided with a Secret of your own, or admission.mode=policy (Kubernetes 1.36 or later: no certificate at all). %s" (printf $offline "cert-manager.io/v1/Certificate")) }}
{{- end }}
{{- range $kind, $enabled := dict "ServiceMonitor" .Values.metrics.serviceMonitor.enabled "PrometheusRule" .Values.metrics.prometheusRule.enabled }}
{{- if and $enabled (not ($apis.Has (printf "monitoring.coreos.com/v1/%s" $kind))) }}
{{- fail (printf "metrics.%s.enabled, but this cluster does not serve monitoring.coreos.com/v1 %s: install the Prometheus Operator's CRDs first, or leave it off. %s" (untitle $kind) $kind (printf $offline (printf "monitoring.coreos.com/v1/%s" $kind))) }}
{{- end }}
{{- end }}
{{- if and .Values.avoidKarpenterNodes (not .Values.affinity) ($apis.Has "eks.amazonaws.com/v1/NodeClass") }}
{{- fail "avoidKarpenterNodes=true, but this cluster is EKS Auto Mode (it serves eks.amazonaws.com/v1 NodeClass), where every node carries karpenter.sh/nodepool: the pods would never be scheduled. Set avoidKarpenterNodes=false to run on Auto Mode's nodes, or give an affinity that picks nodes of your own." }}
{{- end }}
{{- end }}

{{/*
Whole seconds (rounded up) of a duration in node-holder's syntax: `90s`,
`20m`, `1h 30m`, `500ms`.
*/}}
{{- define "node-holder.seconds" -}}
{{- $text := toString . | lower }}
{{- $millis := 0 }}
{{- $parts := regexFindAll "[0-9]+ *[a-z]*" $text -1 }}
{{- if not $parts }}
{{- fail (printf "%q is not a duration (`90s`, `20m`, `2h`)" $text) }}
{{- end }}
{{- range $parts }}
{{- $n := regexFind "^[0-9]+" . | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+ *" . "" }}
{{- if has $unit (list "ms" "msec" "msecs" "millis") }}
{{- $millis = add $millis $n }}
{{- else if has $unit (list "s" "sec" "secs" "second" "seconds") }}
{{- $millis = add $millis (mul $n 1000) }}
{{- else if has $unit (list "m" "min" "mins" "minute" "minutes") }}
{{- $millis = add $millis (mul $n 60000) }}
{{- else if has $unit (list "h" "hr" "hrs" "hour" "hours") }}
{{- $millis = add $millis (mul $n 3600000) }}
{{- else if has $unit (list "d" "day" "days") }}
{{- $millis = add $millis (mul $n 86400000) }}
{{- else if and (eq $unit "") (eq $n 0) }}
{{- else }}
{{- fail (printf "%q: unknown duration unit %q" $text $unit) }}
{{- end }}
{{- end }}
{{- div (add $millis 999) 1000 }}
{{- end }}

{{/* The pod's terminationGracePeriodSeconds: longer than grace + drain; the
drain takes the request timeout and 2 s at most (drain_time in
src/server/connection.rs). */}}
{{- define "node-holder.terminationGracePeriodSeconds" -}}
{{- $needed := add (include "node-holder.seconds" .Values.config.shutdownGrace | int64) (include "node-holder.seconds" .Values.config.requestTimeout | int64) 2 }}
{{- if eq (toString .Values.terminationGracePeriodSeconds) "" }}
{{- add $needed 5 }}
{{- else }}
{{- $given := int64 .Values.terminationGracePeriodSeconds }}
{{- if le $given $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be longer than config.shutdownGrace + config.requestTimeout + 2s (%ds)" $given $needed) }}
{{- end }}
{{- $given }}
{{- end }}
{{- end }}

{{/* A map as `key=value,key=value`, keys sorted (--hold-annotation). */}}
{{- define "node-holder.keyValues" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key (toString $value)) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* --client-ca-file: the mounted CA, or empty (off). */}}
{{- define "node-holder.clientCAFile" -}}
{{- with .Values.config.clientCA }}
{{- if or .secretName .configMapName }}
{{- printf "/etc/node-holder/client-ca/%s" .key }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Whether new Nodes are held by the MutatingAdmissionPolicy (no webhook):
admission.mode policy, or auto on a cluster that serves
admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (the mode that cannot
fail open wherever it exists).
*/}}
{{- define "node-holder.policyMode" -}}
{{- $mode := .Values.admission.mode }}
{{- if or (eq $mode "policy") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")) }}true{{- end }}
{{- end }}

{{/*
The configured holds as a JSON list of [key, value], as `serve` reads
--hold-preset and --hold-annotation: presets first, then the annotations by
key; Karpenter v1's when both are empty; each key once.
*/}}
{{- define "node-holder.holdsJson" -}}
{{- $presets := dict "karpenter-v1" "karpenter.sh/do-not-disrupt" "karpenter-v0" "karpenter.sh/do-not-consolidate" "cluster-autoscaler" "cluster-autoscaler.kubernetes.io/scale-down-disabled" }}
{{- $holds := list }}
{{- $keys := list }}
{{- range .Values.config.holdPresets }}
{{- $key := required (printf "config.holdPresets: unknown preset %q" .) (get $presets .) }}
{{- if not (has $key $keys) }}
{{- $holds = append $holds (list $key "true") }}
{{- $keys = append $keys $key }}
{{- end }}
{{- end }}
{{- range $key, $value := .Values.config.holdAnnotations }}
{{- if not (has $key $keys) }}
{{- $holds = append $holds (list $key (toString $value)) }}
{{- $keys = append $keys $key }}
{{- end }}
{{- end }}
{{- if not $holds }}
{{- $holds = list (list "karpenter.sh/do-not-disrupt" "true") }}
{{- end }}
{{- toJson $holds }}
{{- end }}

{{/*
config.nodeSelector (kubectl's syntax: `a=b,c!=d,e,!f,g in (h,i),j notin (k)`)
as a LabelSelector's matchExpressions, for the policy's binding; with
webhook.objectSelector's own, every one must match.
*/}}
{{- define "node-holder.selectorExpressions" -}}
{{- $expressions := list }}
{{- range regexFindAll "[^,(]+(\\([^)]*\\))?" (toString .Values.config.nodeSelector) -1 }}
{{- $r := trim . }}
{{- if not $r }}
{{- else if regexMatch "^\\S+\\s+(in|notin)\\s*\\(.*\\)$" $r }}
{{- $key := regexFind "^\\S+" $r }}
{{- $op := ternary "In" "NotIn" (regexMatch "^\\S+\\s+in\\s*\\(" $r) }}
{{- $inner := regexReplaceAll "^[^(]*\\((.*)\\)$" $r "${1}" }}
{{- $values := list }}
{{- range splitList "," $inner }}
{{- $values = append $values (trim .) }}
{{- end }}
{{- $expressions = append $expressions (dict "key" $key "operator" $op "values" $values) }}
{{- else if contains "!=" $r }}
{{- $parts := splitList "!=" $r }}
{{- $expressions = append $expressions (dict "key" (trim (first $parts)) "operator" "NotIn" "values" (list (trim (last $parts)))) }}
{{- else if contains "=" $r }}
{{- $parts := splitList "=" (replace "==" "=" $r) }}
{{- $expressions = append $expressions (dict "key" (trim (first $parts)) "operator" "In" "values" (list (trim (last $parts)))) }}
{{- else if hasPrefix "!" $r }}
{{- $expressions = append $expressions (dict "key" (trim (trimPrefix "!" $r)) "operator" "DoesNotExist") }}
{{- else }}
{{- $expressions = append $expressions (dict "key" $r "operator" "Exists") }}
{{- end }}
{{- end }}
{{- with .Values.webhook.objectSelector.matchExpressions }}
{{- $expressions = concat . $expressions }}
{{- end }}
{{- toJson $expressions }}
{{- end }}
