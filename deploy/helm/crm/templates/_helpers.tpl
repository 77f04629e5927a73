{{/*
Names, labels and the pieces every service's objects share. Templates that work on one service
take the context (dict "root" $ "name" <service> "svc" <its values under services>).
*/}}

{{- define "crm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-wide prefix, short enough for "-<service>-migrate" to fit a 63-character name. */}}
{{- define "crm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 44 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 44 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 44 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "crm.componentName" -}}
{{- printf "%s-%s" (include "crm.fullname" .root) .name -}}
{{- end -}}

{{- define "crm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "crm.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .name }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{- define "crm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "crm.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: crm
{{- end -}}

{{- define "crm.isGateway" -}}
{{- if eq .name "gateway" }}true{{ end -}}
{{- end -}}

{{- define "crm.serviceAccountName" -}}
{{- if .svc.serviceAccount.create -}}
{{- default (include "crm.componentName" .) .svc.serviceAccount.name -}}
{{- else -}}
{{- default "default" .svc.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "crm.image" -}}
{{- $v := .root.Values -}}
{{- $repository := .svc.image.repository | default (printf "%s-%s" $v.image.repository .name) -}}
{{- $tag := .svc.image.tag | default $v.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/* The gRPC address of an in-cluster service: every replica, balanced round robin by clients. */}}
{{- define "crm.grpcAddress" -}}
{{- printf "dns:///%s.%s.svc.%s:%d" (include "crm.componentName" .) .root.Release.Namespace .root.Values.clusterDomain (int .root.Values.ports.grpc) -}}
{{- end -}}

{{/* Where APP_SECRET and each connection URL are read from: {name, key} of a Secret. */}}
{{- define "crm.secretRef" -}}
{{- $ref := index .root.Values .source -}}
{{- if $ref.existingSecret -}}
name: {{ $ref.existingSecret }}
key: {{ $ref.existingSecretKey }}
{{- else -}}
name: {{ include "crm.fullname" .root }}
key: {{ .key }}
{{- end -}}
{{- end -}}

{{/* connection name in values -> environment variable */}}
{{- define "crm.connectionVariables" -}}
database: DATABASE_URL
redis: REDIS_URL
nats: NATS_URL
{{- end -}}

{{/*
The container environment: what the chart wires (CRM_ENV, ports, secrets, peer addresses), then
the global env, then the service's env; a later one wins, so operators can set or override any
variable without changing a template. Rendered sorted by name.
*/}}
{{- define "crm.env" -}}
{{- $v := .root.Values -}}
{{- $env := dict "CRM_ENV" "production" "LOG_LEVEL" $v.logLevel "OTEL_SERVICE_NAME" .name -}}
{{- if include "crm.isGateway" . -}}
{{- $_ := set $env "PORT" (toString $v.ports.http) -}}
{{- else -}}
{{- $_ := set $env "GRPC_PORT" (toString $v.ports.grpc) -}}
{{- end -}}
{{- $_ := set $env "METRICS_PORT" (toString $v.ports.metrics) -}}
{{- $appSecret := include "crm.secretRef" (dict "root" .root "source" "appSecret" "key" "APP_SECRET") | fromYaml -}}
{{- $_ := set $env "APP_SECRET" (dict "valueFrom" (dict "secretKeyRef" $appSecret)) -}}
{{- $variables := include "crm.connectionVariables" . | fromYaml -}}
{{- range .svc.connections -}}
{{- $variable := get $variables . -}}
{{- $ref := include "crm.secretRef" (dict "root" $.root "source" . "key" $variable) | fromYaml -}}
{{- $_ := set $env $variable (dict "valueFrom" (dict "secretKeyRef" $ref)) -}}
{{- end -}}
{{- range .svc.peers -}}
{{- $peer := get $v.services . -}}
{{- if and $peer $peer.enabled -}}
{{- $_ := set $env (printf "%s_ADDR" (upper .)) (include "crm.grpcAddress" (dict "root" $.root "name" .)) -}}
{{- end -}}
{{- end -}}
{{- range $name, $value := $v.env -}}
{{- $_ := set $env $name $value -}}
{{- end -}}
{{- range $name, $value := .svc.env -}}
{{- $_ := set $env $name $value -}}
{{- end -}}
{{- range $name := keys $env | sortAlpha }}
{{- $value := get $env $name }}
- name: {{ $name }}
{{- if kindIs "map" $value }}
  {{- toYaml $value | nindent 2 }}
{{- else }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level settings shared by Deployments and migration Jobs. */}}
{{- define "crm.podCommon" -}}
automountServiceAccountToken: false
# Service links would put variables such as GRPC_PORT=tcp://... into every container.
enableServiceLinks: false
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: {{ .root.Values.tmpSizeLimit }}
{{- end -}}

{{/* Container settings shared by Deployments and migration Jobs. */}}
{{- define "crm.containerCommon" -}}
image: {{ include "crm.image" . }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
securityContext:
  {{- toYaml .root.Values.containerSecurityContext | nindent 2 }}
env:
  {{- include "crm.env" . | trim | nindent 2 }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
{{- end -}}

{{/* Checksum of the values behind the chart's Secret: pods roll when a URL or secret changes. */}}
{{- define "crm.secretChecksum" -}}
{{- $v := .Values -}}
{{- list $v.appSecret $v.database $v.redis $v.nats | toJson | sha256sum -}}
{{- end -}}
