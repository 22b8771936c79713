{{/* Names: everything a release makes is called after the release (one per DC). */}}
{{- define "txsync.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "txsync.labels" -}}
app.kubernetes.io/name: txsync
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
txsync.io/dc: {{ .Values.dc }}
{{- end -}}

{{- define "txsync.selector" -}}
app.kubernetes.io/name: txsync
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "txsync.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/*
The values' rules that JSON Schema cannot say: DC ids are unique, and this release's DC
is one of them. Every template includes this, so a bad list fails the render with a
message naming the problem.
*/}}
{{- define "txsync.validate" -}}
{{- $seen := dict -}}
{{- range .Values.dcs -}}
{{- if hasKey $seen .id -}}
{{- fail (printf "dcs: the id %q appears twice; every DC needs its own id" .id) -}}
{{- end -}}
{{- $_ := set $seen .id true -}}
{{- end -}}
{{- if not (hasKey $seen .Values.dc) -}}
{{- fail (printf "dc: %q is not in dcs (%s); list this DC there too" .Values.dc (keys $seen | sortAlpha | join ", ")) -}}
{{- end -}}
{{- if and .Values.access.generate (not .Values.access.secretName) (gt (len .Values.dcs) 1) -}}
{{- fail "access: with more than one DC every release must name the same access secret (a release's generated tokens are refused by the other DCs, so the cluster-wide status and tx get would show them refused). Make it once with `txsync access secret > access.json`, `kubectl apply -f access.json` in every DC's namespace, and set access.secretName=txsync-access (k8s/README.md); access.generate=false turns access control off, for development only" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.secretName: name the secret with ca.crt, tls.crt and tls.key (or set tls.enabled=false for development)" -}}
{{- end -}}
{{- end -}}

{{/* This release's entry of dcs. */}}
{{- define "txsync.self" -}}
{{- range .Values.dcs -}}{{- if eq .id $.Values.dc -}}{{- toJson . -}}{{- end -}}{{- end -}}
{{- end -}}

{{- define "txsync.witness" -}}
{{- $self := include "txsync.self" . | fromJson -}}
{{- if $self.witness -}}true{{- end -}}
{{- end -}}

{{/* The master pod's stable DNS name inside the cluster. */}}
{{- define "txsync.masterHost" -}}
{{ include "txsync.fullname" . }}-master-0.{{ include "txsync.fullname" . }}-master.{{ .Release.Namespace }}.svc.cluster.local
{{- end -}}

{{- define "txsync.env" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
{{- with include "txsync.accessSecret" . }}
- name: TXSYNC_SERVICE_TOKEN
  valueFrom: {secretKeyRef: {name: {{ . }}, key: service-token}}
{{- end }}
{{- if .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .Values.otel.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .Values.otel.samplerArg | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"
{{- end }}
{{- end -}}

{{- define "txsync.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}

{{/* The secret with access.toml and service-token: the operator's, or the one the chart
generates (access control is on unless access.generate is false and no secret is named). */}}
{{- define "txsync.accessSecret" -}}
{{- if .Values.access.secretName -}}
{{ .Values.access.secretName }}
{{- else if .Values.access.generate -}}
{{ include "txsync.fullname" . }}-access
{{- end -}}
{{- end -}}

