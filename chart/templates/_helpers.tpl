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

{{- define "node-holder.serviceAccountName" -}}
{{- default (include "node-holder.fullname" .) .Values.serviceAccount.name }}
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
{{- if not (has .Values.admission.mode (list "webhook" "policy")) }}
{{- fail (printf "admission.mode must be webhook or policy, not %q" .Values.admission.mode) }}
{{- end }}
{{- if not (include "node-holder.policyMode" .) }}
{{- if not (has .Values.tls.mode (list "certManager" "provided")) }}
{{- fail (printf "tls.mode must be certManager or provided, not %q" .Values.tls.mode) }}
{{- end }}
{{- if eq .Values.tls.mode "provided" }}
{{- $_ := required "tls.provided.caBundle (base64 PEM CA) is required when tls.mode=provided" .Values.tls.provided.caBundle }}
{{- end }}
{{- end }}
{{- if and .Values.config.groupHoldDurations (not .Values.config.windowPerLabel) }}
{{- fail "config.groupHoldDurations gives groups their own hold: it needs config.windowPerLabel" }}
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

{{/* The pod's terminationGracePeriodSeconds: longer than grace + drain. */}}
{{- define "node-holder.terminationGracePeriodSeconds" -}}
{{- $needed := add (include "node-holder.seconds" .Values.config.shutdownGrace | int64) (include "node-holder.seconds" .Values.config.drainTimeout | int64) }}
{{- if eq (toString .Values.terminationGracePeriodSeconds) "" }}
{{- add $needed 5 }}
{{- else }}
{{- $given := int64 .Values.terminationGracePeriodSeconds }}
{{- if le $given $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be longer than config.shutdownGrace + config.drainTimeout (%ds)" $given $needed) }}
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

{{/* Whether new Nodes are held by the MutatingAdmissionPolicy (no webhook). */}}
{{- define "node-holder.policyMode" -}}
{{- if eq .Values.admission.mode "policy" }}true{{- end }}
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

{{/*
The hold `helm test` looks for: the first configured hold (the one the
admission policy and the webhook add first), as [key, value].
*/}}
{{- define "node-holder.testHold" -}}
{{- first (fromJsonArray (include "node-holder.holdsJson" .)) | toJson }}
{{- end }}
