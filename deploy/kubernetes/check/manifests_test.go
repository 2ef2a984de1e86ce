// Package check tests deploy/kubernetes offline: every overlay rendered
// with Kustomize's own library, every object strictly decoded into the
// Kubernetes API's Go types (KEDA's ScaledObject into the fields used
// here), and the promises the manifests make checked on the decoded
// objects. It is a module of its own so that the Kubernetes modules stay
// out of orderworker's.
package check

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// root is deploy/kubernetes, seen from this package.
const root = ".."

// overlays are the directories a deployment applies.
var overlays = []string{"overlays/keda", "overlays/hpa"}

// object is one decoded manifest.
type object struct {
	kind, name string
	value      any
}

// newObject returns a pointer to the Go type of apiVersion and kind, or
// an error for a kind this check does not know (which must then be added
// here, not skipped).
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return new(appsv1.Deployment), nil
	case "v1 Service":
		return new(corev1.Service), nil
	case "v1 ConfigMap":
		return new(corev1.ConfigMap), nil
	case "v1 Secret":
		return new(corev1.Secret), nil
	case "policy/v1 PodDisruptionBudget":
		return new(policyv1.PodDisruptionBudget), nil
	case "networking.k8s.io/v1 NetworkPolicy":
		return new(networkingv1.NetworkPolicy), nil
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return new(autoscalingv2.HorizontalPodAutoscaler), nil
	case "keda.sh/v1alpha1 ScaledObject":
		return new(ScaledObject), nil
	}
	return nil, fmt.Errorf("%s %s: a kind the check does not know", apiVersion, kind)
}

// decode strictly decodes one YAML document into its Go type: a field the
// type lacks, a field given twice, or a value of the wrong type fails.
func decode(doc []byte) (object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return object{}, fmt.Errorf("read apiVersion and kind: %w", err)
	}
	v, err := newObject(head.APIVersion, head.Kind)
	if err != nil {
		return object{}, err
	}
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		return object{}, fmt.Errorf("%s %s: %w", head.Kind, head.Metadata.Name, err)
	}
	return object{head.Kind, head.Metadata.Name, v}, nil
}

// render builds the kustomization in dir of fs and strictly decodes every
// object it yields.
func render(fs filesys.FileSystem, dir string) ([]object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(fs, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []object
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		o, err := decode(y)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func renderOverlay(t *testing.T, overlay string) []object {
	t.Helper()
	objs, err := render(filesys.MakeFsOnDisk(), filepath.Join(root, overlay))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestEveryFileDecodes decodes every YAML document under deploy/kubernetes
// as it is written (before Kustomize, which would drop a field it does
// not know of some kinds), except the kustomizations and the
// prometheus-adapter values, which are not Kubernetes objects.
func TestEveryFileDecodes(t *testing.T) {
	n := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		switch filepath.Base(path) {
		case "kustomization.yaml", "prometheus-adapter-values.yaml":
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, doc := range splitDocs(data) {
			if _, err := decode(doc); err != nil {
				t.Errorf("%s, document %d: %v", path, i+1, err)
			}
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("decoded %d documents; the walk missed the manifests", n)
	}
}

// splitDocs splits a YAML stream at its --- lines, dropping empty documents.
func splitDocs(data []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestOverlays renders each overlay and checks what the manifests promise.
func TestOverlays(t *testing.T) {
	settings := documentedSettings(t)
	for _, overlay := range overlays {
		t.Run(filepath.Base(overlay), func(t *testing.T) {
			objs := renderOverlay(t, overlay)
			byKind := map[string][]object{}
			for _, o := range objs {
				byKind[o.kind] = append(byKind[o.kind], o)
			}
			deployments := map[string]*appsv1.Deployment{}
			for _, o := range byKind["Deployment"] {
				deployments[o.name] = o.value.(*appsv1.Deployment)
			}
			for _, name := range []string{"orderworker-worker", "orderworker-intake", "orderworker-dashboard"} {
				d, ok := deployments[name]
				if !ok {
					t.Errorf("no Deployment %s", name)
					continue
				}
				checkDeployment(t, d, settings)
			}
			if w := deployments["orderworker-worker"]; w != nil && w.Spec.Replicas != nil {
				t.Errorf("the autoscaled worker Deployment sets replicas (%d): every apply would reset the autoscaler's count", *w.Spec.Replicas)
			}
			// The shared ConfigMap's keys reach every process (envFrom):
			// each must be a setting of at least one.
			for _, o := range byKind["ConfigMap"] {
				for k := range o.value.(*corev1.ConfigMap).Data {
					if !settings["worker"].has(k) && !settings["intake"].has(k) && !settings["dashboard"].has(k) && !slices.Contains(manifestOnly, k) {
						t.Errorf("ConfigMap %s: %s is no process's setting", o.name, k)
					}
				}
			}
			checkServices(t, byKind["Service"], deployments)
			checkPDB(t, byKind["PodDisruptionBudget"], deployments["orderworker-worker"])
			checkNetworkPolicies(t, byKind["NetworkPolicy"], byKind["ConfigMap"], deployments)
			for _, o := range objs {
				if ns := namespaceOf(o.value); ns != "orderworker" {
					t.Errorf("%s %s in namespace %q, not orderworker", o.kind, o.name, ns)
				}
			}
			switch filepath.Base(overlay) {
			case "keda":
				checkScaledObject(t, byKind["ScaledObject"])
			case "hpa":
				checkHPA(t, byKind["HorizontalPodAutoscaler"])
			}
		})
	}
}

func namespaceOf(v any) string {
	switch o := v.(type) {
	case *appsv1.Deployment:
		return o.Namespace
	case *corev1.Service:
		return o.Namespace
	case *corev1.ConfigMap:
		return o.Namespace
	case *policyv1.PodDisruptionBudget:
		return o.Namespace
	case *networkingv1.NetworkPolicy:
		return o.Namespace
	case *autoscalingv2.HorizontalPodAutoscaler:
		return o.Namespace
	case *ScaledObject:
		return o.Metadata.Namespace
	}
	return "?"
}

// shutdownEnv is each component's shutdown setting, which its grace
// period must exceed.
var shutdownEnv = map[string]string{
	"worker":    "SHUTDOWN_TIMEOUT",
	"intake":    "INTAKE_SHUTDOWN_TIMEOUT",
	"dashboard": "DASHBOARD_SHUTDOWN_TIMEOUT",
}

// manifestOnly are the variables the manifests define for their own use
// (to compose REDIS_URL), which no binary reads.
var manifestOnly = []string{"REDIS_ADDR", "REDIS_PASSWORD", "REDIS_SCHEME"}

func checkDeployment(t *testing.T, d *appsv1.Deployment, settings map[string]documented) {
	t.Helper()
	component := d.Spec.Template.Labels["app.kubernetes.io/component"]
	sel := d.Spec.Selector.MatchLabels
	for k, v := range sel {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("%s: selector %s=%s does not match its pods' labels", d.Name, k, v)
		}
	}
	pod := d.Spec.Template.Spec
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Errorf("%s: pods not run as the image's non-root user 65532", d.Name)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", d.Name, len(pod.Containers))
	}
	c := pod.Containers[0]
	if !strings.HasPrefix(c.Image, "registry.example.com/orderworker:") {
		t.Errorf("%s: image %q: the overlay's images entry did not apply", d.Name, c.Image)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if !settings[component].has(e.Name) && !slices.Contains(manifestOnly, e.Name) {
			t.Errorf("%s: env %s is not in the %s's settings table: a misspelling, or a setting of another process, which the %s would ignore", d.Name, e.Name, component, component)
		}
	}
	if !strings.HasPrefix(env["REDIS_URL"], "$(REDIS_SCHEME)://") || !strings.Contains(env["REDIS_URL"], "$(REDIS_PASSWORD)@$(REDIS_ADDR)") {
		t.Errorf("%s: REDIS_URL %q does not take its scheme from the ConfigMap and its password from the Secret", d.Name, env["REDIS_URL"])
	}
	// Shutdown: the grace period exceeds the process's own timeout.
	shutdown, err := time.ParseDuration(env[shutdownEnv[component]])
	if err != nil {
		t.Errorf("%s: %s: %v", d.Name, shutdownEnv[component], err)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= shutdown+5*time.Second {
		t.Errorf("%s: terminationGracePeriodSeconds %v not above %s %s with room to spare", d.Name, g, shutdownEnv[component], shutdown)
	}
	// Probes on the health endpoints, on a port the container declares.
	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[p.Name] = true
	}
	for probe, want := range map[*corev1.Probe]string{c.ReadinessProbe: "/readyz", c.LivenessProbe: "/healthz"} {
		if probe == nil || probe.HTTPGet == nil {
			t.Errorf("%s: no %s probe", d.Name, want)
			continue
		}
		if probe.HTTPGet.Path != want || !ports[probe.HTTPGet.Port.StrVal] {
			t.Errorf("%s: probe %s on %s, want %s on a declared port", d.Name, probe.HTTPGet.Path, probe.HTTPGet.Port.String(), want)
		}
	}
	// The listen address is every interface, on the declared port.
	addrEnv := map[string]string{"worker": "OPS_ADDR", "intake": "INTAKE_ADDR", "dashboard": "DASHBOARD_ADDR"}[component]
	if a := env[addrEnv]; !strings.HasPrefix(a, ":") || fmt.Sprint(c.Ports[0].ContainerPort) != a[1:] {
		t.Errorf("%s: %s=%q does not listen on every interface at the container port %d", d.Name, addrEnv, a, c.Ports[0].ContainerPort)
	}
	req, lim := c.Resources.Requests, c.Resources.Limits
	if req.Memory().IsZero() || req.Cpu().IsZero() || lim.Memory().IsZero() || lim.Memory().Cmp(*req.Memory()) < 0 {
		t.Errorf("%s: resources %v / %v: want CPU and memory requests and a memory limit above the request", d.Name, req, lim)
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: container not read-only without privilege escalation", d.Name)
	}
}

func checkServices(t *testing.T, svcs []object, deployments map[string]*appsv1.Deployment) {
	t.Helper()
	for _, want := range []string{"orderworker-intake", "orderworker-dashboard", "orderworker-worker-metrics"} {
		i := slices.IndexFunc(svcs, func(o object) bool { return o.name == want })
		if i < 0 {
			t.Errorf("no Service %s", want)
			continue
		}
		s := svcs[i].value.(*corev1.Service)
		matched := false
		for _, d := range deployments {
			if selects(s.Spec.Selector, d.Spec.Template.Labels) {
				matched = true
				ports := map[string]bool{}
				for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
					ports[p.Name] = true
				}
				for _, p := range s.Spec.Ports {
					if !ports[p.TargetPort.StrVal] {
						t.Errorf("Service %s: target port %s is not a port of %s", s.Name, p.TargetPort.String(), d.Name)
					}
				}
			}
		}
		if !matched {
			t.Errorf("Service %s selects no Deployment's pods", s.Name)
		}
	}
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func checkPDB(t *testing.T, pdbs []object, worker *appsv1.Deployment) {
	t.Helper()
	if len(pdbs) != 1 || worker == nil {
		t.Fatalf("%d PodDisruptionBudgets, want 1 for the workers", len(pdbs))
	}
	p := pdbs[0].value.(*policyv1.PodDisruptionBudget)
	if !selects(p.Spec.Selector.MatchLabels, worker.Spec.Template.Labels) {
		t.Errorf("PodDisruptionBudget %s does not select the workers", p.Name)
	}
	if p.Spec.MaxUnavailable == nil && p.Spec.MinAvailable == nil {
		t.Errorf("PodDisruptionBudget %s bounds nothing", p.Name)
	}
}

// kindQueues is the label regular expression the autoscalers select the
// queues with: every queue named as the kinds' queues are, order_<name>,
// and each shard of it, <queue>:N. It names no kind, so a kind added to
// the table needs no change here or in the overlays; cmd/producer's
// TestEveryKindScalesTheWorkers checks that it matches every queue of
// every kind of the table, shards included.
const kindQueues = `order_[^:]+(:[0-9]+)?`

// pendingQuery is the backlog the autoscalers must scale on: the pending
// tasks of every queue kindQueues matches, summed, in one query.
var pendingQuery = regexp.MustCompile(`^sum\(asynq_tasks_enqueued_total\{[^}]*queue=~"` + regexp.QuoteMeta(kindQueues) + `",state="pending"\}\)$`)

func checkScaledObject(t *testing.T, sos []object) {
	t.Helper()
	if len(sos) != 1 {
		t.Fatalf("%d ScaledObjects, want 1", len(sos))
	}
	so := sos[0].value.(*ScaledObject)
	if so.Spec.ScaleTargetRef.Name != "orderworker-worker" {
		t.Errorf("ScaledObject scales %q, not the workers", so.Spec.ScaleTargetRef.Name)
	}
	if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < 2 {
		t.Errorf("ScaledObject may scale the workers below 2, which the PodDisruptionBudget then blocks")
	}
	if len(so.Spec.Triggers) != 1 {
		t.Errorf("%d triggers, want one, on the backlog of every kind's queue", len(so.Spec.Triggers))
	}
	for _, tr := range so.Spec.Triggers {
		if tr.Type != "prometheus" {
			t.Errorf("trigger type %q, want prometheus", tr.Type)
			continue
		}
		if !pendingQuery.MatchString(tr.Metadata["query"]) {
			t.Errorf("trigger query %q is not the pending backlog of every kind's queue and shard (queue=~%q)", tr.Metadata["query"], kindQueues)
			continue
		}
		if tr.Metadata["threshold"] == "" || tr.Metadata["serverAddress"] == "" {
			t.Errorf("trigger %q lacks threshold or serverAddress", tr.Metadata["query"])
		}
		// KEDA's default ("true") reads an empty result as 0, which scales
		// the workers to the minimum whenever the queue gauges are missing.
		if tr.Metadata["ignoreNullValues"] != "false" {
			t.Errorf("trigger %q: ignoreNullValues %q, want \"false\" (an empty result must not read as no backlog)", tr.Metadata["query"], tr.Metadata["ignoreNullValues"])
		}
	}
}

func checkHPA(t *testing.T, hpas []object) {
	t.Helper()
	if len(hpas) != 1 {
		t.Fatalf("%d HorizontalPodAutoscalers, want 1", len(hpas))
	}
	h := hpas[0].value.(*autoscalingv2.HorizontalPodAutoscaler)
	if h.Spec.ScaleTargetRef.Name != "orderworker-worker" || h.Spec.ScaleTargetRef.Kind != "Deployment" {
		t.Errorf("the HPA scales %+v, not the workers' Deployment", h.Spec.ScaleTargetRef)
	}
	// Every external metric it reads is one the adapter's rules serve, on
	// the same query as the KEDA overlay's.
	data, err := os.ReadFile(filepath.Join(root, "overlays/hpa/prometheus-adapter-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Prometheus struct {
			URL  string `json:"url"`
			Port int    `json:"port"`
		} `json:"prometheus"`
		Rules struct {
			Default  bool `json:"default"`
			External []struct {
				SeriesQuery string `json:"seriesQuery"`
				Resources   struct {
					Overrides map[string]struct {
						Resource string `json:"resource"`
					} `json:"overrides"`
				} `json:"resources"`
				Name struct {
					As string `json:"as"`
				} `json:"name"`
				MetricsQuery string `json:"metricsQuery"`
			} `json:"external"`
		} `json:"rules"`
	}
	if err := yaml.UnmarshalStrict(data, &values); err != nil {
		t.Fatalf("prometheus-adapter-values.yaml: %v", err)
	}
	served := map[string]string{}
	for _, r := range values.Rules.External {
		served[r.Name.As] = strings.Replace(r.MetricsQuery, "<<.LabelMatchers>>,", "", 1)
	}
	for _, m := range h.Spec.Metrics {
		if m.Type != autoscalingv2.ExternalMetricSourceType || m.External == nil {
			t.Errorf("HPA metric of type %s, want External", m.Type)
			continue
		}
		q, ok := served[m.External.Metric.Name]
		if !ok {
			t.Errorf("HPA metric %s: no prometheus-adapter rule serves it", m.External.Metric.Name)
			continue
		}
		if !pendingQuery.MatchString(q) {
			t.Errorf("adapter rule %s: query %q is not the pending backlog of every kind's queue and shard (queue=~%q)", m.External.Metric.Name, q, kindQueues)
		}
		if m.External.Target.Type != autoscalingv2.AverageValueMetricType || m.External.Target.AverageValue == nil {
			t.Errorf("HPA metric %s: want an AverageValue target (backlog per replica)", m.External.Metric.Name)
		}
	}
	if len(h.Spec.Metrics) != 1 {
		t.Errorf("%d HPA metrics, want one, the backlog of every kind's queue", len(h.Spec.Metrics))
	}
}

// documented is the environment variables of one component's settings
// table. A row of a family of settings, one per kind (`<KIND>_WAIT_MIN`),
// stands for the variable of every kind: the kinds are the worker's, which
// this module does not import.
type documented map[string]bool

// kindFamily is the placeholder of a family row's variable, and kindEnv
// what a kind's name is in a variable's.
const kindFamily = "<KIND>_"

var kindEnv = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// has reports whether the table lists name, itself or through a family
// row (any kind name in upper case before the row's suffix).
func (d documented) has(name string) bool {
	if d[name] {
		return true
	}
	for k := range d {
		suffix, ok := strings.CutPrefix(k, kindFamily)
		kind, found := strings.CutSuffix(name, "_"+suffix)
		if ok && found && kindEnv.MatchString(kind) {
			return true
		}
	}
	return false
}

// documentedSettings returns, by component, every environment variable
// its settings table in the docs lists (the tables the binaries' own
// tests keep equal to what they read), and for the worker and the intake
// the tracing variables.
func documentedSettings(t *testing.T) map[string]documented {
	t.Helper()
	row := regexp.MustCompile("(?m)^\\| (?:`-[a-z<>-]+` \\| )?`((?:<KIND>_)?[A-Z][A-Z0-9_]+)`")
	table := func(file, marker string) documented {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		if marker != "" {
			b := strings.Index(text, "<!-- "+marker+":begin -->")
			e := strings.Index(text, "<!-- "+marker+":end -->")
			if b < 0 || e < b {
				t.Fatalf("%s: no %s table", file, marker)
			}
			text = text[b:e]
		}
		out := documented{}
		for _, m := range row.FindAllStringSubmatch(text, -1) {
			if marker != "" || strings.HasPrefix(m[1], "OTEL_") {
				out[m[1]] = true
			}
		}
		return out
	}
	ops := "../../../docs/operations.md"
	tracing := table(ops, "")
	out := map[string]documented{
		"worker":    table(ops, "worker-settings"),
		"intake":    table(ops, "intake-settings"),
		"dashboard": table("../../../cmd/dashboard/README.md", "settings"),
	}
	for _, c := range []string{"worker", "intake"} {
		for k := range tracing {
			out[c][k] = true
		}
	}
	for c, must := range map[string]string{"worker": "SHUTDOWN_TIMEOUT", "intake": "INTAKE_API_KEYS", "dashboard": "DASHBOARD_PASSWORD"} {
		if !out[c][must] || !out[c]["REDIS_URL"] || (c != "dashboard" && !out[c]["OTEL_SERVICE_NAME"]) {
			t.Fatalf("the parse of the %s's settings table missed %s", c, must)
		}
	}
	if !out["worker"].has("MODIFY_WAIT_DEADLINE") || out["worker"].has("WAIT_DEADLINE") || out["worker"].has("modify_WAIT_DEADLINE") {
		t.Fatal("the worker's per-kind rows (<KIND>_WAIT_DEADLINE) are not read as a family")
	}
	return out
}

// TestStrictDecodingFails proves that the check fails on the mistakes it
// is for: a misspelled field and a wrong type, in a file and through an
// overlay.
func TestStrictDecodingFails(t *testing.T) {
	good := `apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      terminationGracePeriodSeconds: 40
      containers: [{name: c, image: i}]
`
	if _, err := decode([]byte(good)); err != nil {
		t.Fatalf("the good document fails: %v", err)
	}
	for name, bad := range map[string]string{
		"misspelled field": strings.Replace(good, "terminationGracePeriodSeconds", "terminationGracePeriodSecond", 1),
		"wrong type":       strings.Replace(good, "terminationGracePeriodSeconds: 40", "terminationGracePeriodSeconds: forty", 1),
		"duplicate field":  strings.Replace(good, "      containers:", "      terminationGracePeriodSeconds: 41\n      containers:", 1),
		"unknown kind":     strings.Replace(good, "kind: Deployment", "kind: Deploymnet", 1),
		"scaledobject typo": `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: x}
spec:
  scaleTargetRef: {name: w}
  minReplicaCont: 2
  triggers: []
`,
		"scaledobject wrong type": `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: x}
spec:
  scaleTargetRef: {name: w}
  minReplicaCount: "two"
  triggers: []
`,
	} {
		if _, err := decode([]byte(bad)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}

	// Through Kustomize: the real base and overlay, copied into memory,
	// with one field of the worker Deployment misspelled.
	fs := filesys.MakeFsInMemory()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		return fs.WriteFile(filepath.Join("/k", rel), data)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := render(fs, "/k/overlays/keda"); err != nil {
		t.Fatalf("the in-memory copy does not render: %v", err)
	}
	data, err := fs.ReadFile("/k/base/worker.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string][2]string{
		"misspelled": {"readinessProbe:", "readynessProbe:"},
		"wrong type": {"terminationGracePeriodSeconds: 40", "terminationGracePeriodSeconds: \"40s\""},
	} {
		if !bytes.Contains(data, []byte(edit[0])) {
			t.Fatalf("worker.yaml lacks %q", edit[0])
		}
		if err := fs.WriteFile("/k/base/worker.yaml", bytes.Replace(data, []byte(edit[0]), []byte(edit[1]), 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := render(fs, "/k/overlays/keda"); err == nil {
			t.Errorf("%s: the overlay renders and decodes", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
