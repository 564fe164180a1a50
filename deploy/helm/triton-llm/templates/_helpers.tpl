{{/* Names and labels. The templates use a small Go-template subset (see tests/unit/helm_lite.py). */}}
{{- define "triton-llm.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "triton-llm.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "triton-llm.labels" -}}
{{ include "triton-llm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* GPUs per pod: one per MPI rank, world size = tp x pp. */}}
{{- define "triton-llm.gpus" -}}
{{ mul .Values.trtllm.tpSize .Values.trtllm.ppSize }}
{{- end -}}
