{{/*
The objects of one service, rendered for each enabled entry of .Values.services by
templates/services.yaml. Context: (dict "root" $ "name" <service> "svc" <its values>).
*/}}

{{- define "crm.containerPorts" -}}
{{- if include "crm.isGateway" . }}
- name: http
  containerPort: {{ .root.Values.ports.http }}
  protocol: TCP
{{- else }}
- name: grpc
  containerPort: {{ .root.Values.ports.grpc }}
  protocol: TCP
{{- end }}
- name: metrics
  containerPort: {{ .root.Values.ports.metrics }}
  protocol: TCP
{{- end -}}

{{/*
gRPC services answer the standard gRPC health check (native probes). The gateway's /readyz
checks what a request needs (every upstream and the database), which suits readiness; Redis and
NATS outages are served (degraded, shown by /healthz); liveness and startup use /livez, which
only proves the process serves HTTP, so a dependency outage restarts nothing.
*/}}
{{- define "crm.probes" -}}
{{- if include "crm.isGateway" . }}
startupProbe:
  httpGet:
    path: /livez
    port: http
  periodSeconds: 2
  failureThreshold: 60
readinessProbe:
  httpGet:
    path: {{ .root.Values.gateway.readinessPath }}
    port: http
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
livenessProbe:
  httpGet:
    path: /livez
    port: http
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
{{- else }}
{{- $port := int .root.Values.ports.grpc }}
startupProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 2
  failureThreshold: 60
readinessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 2
livenessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
{{- end }}
{{- end -}}

{{- define "crm.deployment" -}}
{{- $svc := .svc -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "crm.componentName" . }}
  labels:
    {{- include "crm.labels" . | nindent 4 }}
spec:
  {{- if not $svc.autoscaling.enabled }}
  replicas: {{ $svc.replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  selector:
    matchLabels:
      {{- include "crm.selectorLabels" . | nindent 6 }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 25%
      maxUnavailable: 0
  template:
    metadata:
      labels:
        {{- include "crm.labels" . | nindent 8 }}
        {{- with $svc.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        checksum/secret: {{ include "crm.secretChecksum" .root }}
        {{- with $svc.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "crm.serviceAccountName" . }}
      {{- include "crm.podCommon" . | nindent 6 }}
      terminationGracePeriodSeconds: {{ .root.Values.terminationGracePeriodSeconds }}
      {{- with $svc.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $svc.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .name }}
          {{- include "crm.containerCommon" . | nindent 10 }}
          ports:
            {{- include "crm.containerPorts" . | trim | nindent 12 }}
          {{- include "crm.probes" . | trim | nindent 10 }}
          resources:
            {{- toYaml $svc.resources | nindent 12 }}
          lifecycle:
            preStop:
              sleep:
                seconds: {{ .root.Values.preStopSleepSeconds }}
{{- end -}}

{{/*
gRPC services get a headless Service: their DNS name resolves to every ready pod and clients
balance calls round robin over them (a ClusterIP would pin each long-lived HTTP/2 connection,
and so all its calls, to one pod). The gateway gets an ordinary Service for HTTP.
*/}}
{{- define "crm.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "crm.componentName" . }}
  labels:
    {{- include "crm.labels" . | nindent 4 }}
  {{- if include "crm.isGateway" . }}
  {{- with .root.Values.gateway.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- end }}
spec:
  {{- if include "crm.isGateway" . }}
  type: {{ .root.Values.gateway.service.type }}
  ports:
    - name: http
      port: {{ .root.Values.gateway.service.port }}
      targetPort: http
      protocol: TCP
  {{- else }}
  clusterIP: None
  ports:
    - name: grpc
      port: {{ .root.Values.ports.grpc }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    - name: metrics
      port: {{ .root.Values.ports.metrics }}
      targetPort: metrics
      protocol: TCP
  {{- end }}
  selector:
    {{- include "crm.selectorLabels" . | nindent 4 }}
{{- end -}}

{{/*
The gateway's metrics port gets a Service of its own (headless, inside the cluster), for the
ServiceMonitor: its public Service (often a LoadBalancer) carries HTTP only.
*/}}
{{- define "crm.metricsService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "crm.componentName" . }}-metrics
  labels:
    {{- include "crm.labels" . | nindent 4 }}
spec:
  clusterIP: None
  ports:
    - name: metrics
      port: {{ .root.Values.ports.metrics }}
      targetPort: metrics
      protocol: TCP
  selector:
    {{- include "crm.selectorLabels" . | nindent 4 }}
{{- end -}}

{{- define "crm.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "crm.serviceAccountName" . }}
  labels:
    {{- include "crm.labels" . | nindent 4 }}
  {{- with .svc.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: false
{{- end -}}

{{- define "crm.podDisruptionBudget" -}}
{{- $budget := .svc.podDisruptionBudget -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "crm.componentName" . }}
  labels:
    {{- include "crm.labels" . | nindent 4 }}
spec:
  {{- if hasKey $budget "minAvailable" }}
  minAvailable: {{ $budget.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $budget.maxUnavailable | default 1 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "crm.selectorLabels" . | nindent 6 }}
{{- end -}}

{{- define "crm.horizontalPodAutoscaler" -}}
{{- $scaling := .svc.autoscaling -}}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "crm.componentName" . }}
  labels:
    {{- include "crm.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "crm.componentName" . }}
  minReplicas: {{ $scaling.minReplicas }}
  maxReplicas: {{ $scaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $scaling.targetCPUUtilizationPercentage }}
    {{- with $scaling.targetMemoryUtilizationPercentage }}
    - type: Resource
      resource:
        name: memory
        target:
          type: Utilization
          averageUtilization: {{ . }}
    {{- end }}
  {{- with $scaling.behavior }}
  behavior:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
