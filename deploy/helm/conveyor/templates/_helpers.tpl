{{/* Names and labels, as `helm create` makes them. */}}
{{- define "conveyor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "conveyor.fullname" -}}
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

{{- define "conveyor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "conveyor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "conveyor.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "conveyor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* /dev/shm size: the values' sizeLimit, else what every arena may grow to (as `conveyor serve` checks). */}}
{{- define "conveyor.shmSize" -}}
{{- $c := .Values.conveyor }}
{{- if .Values.shm.sizeLimit }}
{{- .Values.shm.sizeLimit }}
{{- else }}
{{- mul (add (int $c.workers) (int $c.httpIngress) (int $c.grpcIngress)) (int $c.arenaSizeMiB) }}Mi
{{- end }}
{{- end }}

{{/* The arguments of `conveyor serve` (the image's entrypoint). */}}
{{- define "conveyor.args" -}}
{{- $c := .Values.conveyor }}
{{- $repo := .Values.modelRepository }}
{{- if eq $repo.source "cloud" }}
{{- $uri := required "modelRepository.cloud.uri is required with source cloud" $repo.cloud.uri }}
{{- if not (regexMatch "^(s3|gs|as)://" $uri) }}
{{- fail "modelRepository.cloud.uri must be an s3://, gs:// or as:// URL" }}
{{- end }}
- --model-repository={{ $uri }}
{{- else if ne $repo.source "example" }}
- --model-repository={{ $repo.mountPath }}
{{- end }}
- --workers={{ int $c.workers }}
- --http-ingress={{ int $c.httpIngress }}
- --grpc-ingress={{ int $c.grpcIngress }}
- --http-port={{ int .Values.ports.http }}
- --grpc-port={{ int .Values.ports.grpc }}
- --metrics-port={{ int .Values.ports.metrics }}
- --arena-size={{ mul (int $c.arenaSizeMiB) 1048576 }}
- --drain-grace-secs={{ $c.drainGraceSecs }}
- --exit-timeout-secs={{ $c.exitTimeoutSecs }}
- --model-control-mode={{ $c.modelControlMode }}
- --allow-client-shm={{ $c.allowClientShm }}
- --log-verbose={{ int $c.logVerbose }}
{{- range $c.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
