package check

// ScaledObject is KEDA's keda.sh/v1alpha1 ScaledObject, reduced to the
// fields the manifests use, with their JSON names and types as KEDA's
// CRD has them (github.com/kedacore/keda, apis/keda/v1alpha1). KEDA's
// module is not a dependency: it brings most of Kubernetes' controller
// stack. Strict decoding into this type fails on any field outside it,
// so a field added to the manifests must be added here, checked against
// KEDA's CRD.
type ScaledObject struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Metadata   ObjectMeta       `json:"metadata"`
	Spec       ScaledObjectSpec `json:"spec"`
}

// ObjectMeta is the part of Kubernetes' metadata the manifests and
// Kustomize's transformers write.
type ObjectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ScaledObjectSpec is the spec of a ScaledObject.
type ScaledObjectSpec struct {
	ScaleTargetRef  ScaleTarget    `json:"scaleTargetRef"`
	PollingInterval *int32         `json:"pollingInterval,omitempty"`
	CooldownPeriod  *int32         `json:"cooldownPeriod,omitempty"`
	MinReplicaCount *int32         `json:"minReplicaCount,omitempty"`
	MaxReplicaCount *int32         `json:"maxReplicaCount,omitempty"`
	Triggers        []ScaleTrigger `json:"triggers"`
}

// ScaleTarget names the workload a ScaledObject scales (a Deployment
// when apiVersion and kind are left out).
type ScaleTarget struct {
	Name       string `json:"name"`
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
}

// ScaleTrigger is one trigger; its metadata is a map of strings in KEDA's
// CRD, every value a string (a number must be quoted).
type ScaleTrigger struct {
	Type     string            `json:"type"`
	Name     string            `json:"name,omitempty"`
	Metadata map[string]string `json:"metadata"`
}
