package check

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The peers the manifests let in, as peerName names them: the ingress
// controller's namespace, and Prometheus's pods in the monitoring
// namespace.
const (
	ingressController = "ns{kubernetes.io/metadata.name=ingress-nginx}"
	prometheus        = "ns{kubernetes.io/metadata.name=monitoring} pods{app.kubernetes.io/name=prometheus}"
	kubeDNS           = "ns{kubernetes.io/metadata.name=kube-system} pods{k8s-app=kube-dns}"
)

// wantIngress is, for each Deployment, every source that may reach it:
// no other, and none of them on a port the pod does not declare.
var wantIngress = map[string][]string{
	"orderworker-intake":    {ingressController},
	"orderworker-dashboard": {ingressController, prometheus},
	"orderworker-worker":    {prometheus},
}

// metadataAddr is the cloud providers' instance metadata address (AWS,
// GCP, Azure alike), which hands out the node's credentials: no egress
// rule may reach it.
var metadataAddr = netip.MustParseAddr("169.254.169.254")

// checkNetworkPolicies reports networkProblems of the rendered policies.
func checkNetworkPolicies(t *testing.T, nps, cms []object, deployments map[string]*appsv1.Deployment) {
	t.Helper()
	var policies []*networkingv1.NetworkPolicy
	for _, o := range nps {
		policies = append(policies, o.value.(*networkingv1.NetworkPolicy))
	}
	redisPort := 0
	for _, o := range cms {
		cm := o.value.(*corev1.ConfigMap)
		if s := cm.Data["REDIS_SCHEME"]; s != "redis" && s != "rediss" {
			t.Errorf("ConfigMap %s: REDIS_SCHEME %q, want redis or rediss", cm.Name, s)
		}
		if _, p, err := net.SplitHostPort(cm.Data["REDIS_ADDR"]); err == nil {
			redisPort, _ = strconv.Atoi(p)
		}
	}
	if redisPort == 0 {
		t.Fatal("no ConfigMap with a REDIS_ADDR of host:port")
	}
	for _, p := range networkProblems(policies, deployments, redisPort) {
		t.Error(p)
	}
}

// networkProblems checks what deploy/kubernetes/base/networkpolicy.yaml
// promises, on the policies as rendered:
//   - every Deployment's pods are selected by a policy of each type,
//     Ingress and Egress, so that whatever no rule allows is denied;
//   - every rule names its peers and its ports (an empty from, to or
//     ports is every source, destination or port);
//   - the sources of each Deployment are exactly wantIngress's, on ports
//     its container declares;
//   - no egress peer is every pod of every namespace, nor an address
//     block holding the metadata address, and each Deployment reaches the
//     cluster's DNS on 53 (UDP and TCP), Redis on REDIS_ADDR's port, and
//     some address on 443 (the order API and the IdP).
func networkProblems(nps []*networkingv1.NetworkPolicy, deployments map[string]*appsv1.Deployment, redisPort int) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	for _, name := range slices.Sorted(maps.Keys(deployments)) {
		d := deployments[name]
		ports := map[string]bool{}
		for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
			ports[p.Name] = true
			ports[strconv.Itoa(int(p.ContainerPort))] = true
		}
		governed := map[networkingv1.PolicyType]bool{}
		sources := map[string]bool{}
		reaches := map[string]bool{} // "peer port/protocol"
		for _, np := range nps {
			if !selects(np.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) || len(np.Spec.PodSelector.MatchExpressions) > 0 {
				continue
			}
			for _, pt := range np.Spec.PolicyTypes {
				governed[pt] = true
			}
			for i, rule := range np.Spec.Ingress {
				if len(rule.From) == 0 || len(rule.Ports) == 0 {
					bad("NetworkPolicy %s, ingress rule %d: from %d peers on %d ports: an empty list is every source or port", np.Name, i+1, len(rule.From), len(rule.Ports))
				}
				for _, p := range rule.Ports {
					if p.Port == nil || !ports[p.Port.String()] {
						bad("NetworkPolicy %s lets into %s a port its container does not declare (%v)", np.Name, name, p.Port)
					}
				}
				for _, peer := range rule.From {
					sources[peerName(peer)] = true
				}
			}
			for i, rule := range np.Spec.Egress {
				if len(rule.To) == 0 || len(rule.Ports) == 0 {
					bad("NetworkPolicy %s, egress rule %d: to %d peers on %d ports: an empty list is every destination or port", np.Name, i+1, len(rule.To), len(rule.Ports))
				}
				for _, peer := range rule.To {
					if p := openPeer(peer); p != "" {
						bad("NetworkPolicy %s lets %s out to %s", np.Name, name, p)
					}
					for _, port := range rule.Ports {
						if port.Port == nil {
							continue
						}
						proto := corev1.ProtocolTCP
						if port.Protocol != nil {
							proto = *port.Protocol
						}
						reaches[fmt.Sprintf("%s %s/%s", peerName(peer), port.Port.String(), proto)] = true
					}
				}
			}
		}
		for _, pt := range []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress} {
			if !governed[pt] {
				bad("%s is under no %s policy: every %s is allowed", name, pt, strings.ToLower(string(pt)))
			}
		}
		if got, want := slices.Sorted(maps.Keys(sources)), slices.Sorted(slices.Values(wantIngress[name])); !slices.Equal(got, want) {
			bad("%s takes traffic from %q, want %q", name, got, want)
		}
		need := []string{kubeDNS + " 53/UDP", kubeDNS + " 53/TCP"}
		redis, https := false, false
		for r := range reaches {
			redis = redis || strings.HasSuffix(r, fmt.Sprintf(" %d/TCP", redisPort))
			https = https || strings.HasSuffix(r, " 443/TCP")
		}
		for _, n := range need {
			if !reaches[n] {
				bad("%s cannot reach %s", name, n)
			}
		}
		if !redis {
			bad("%s cannot reach Redis on REDIS_ADDR's port %d", name, redisPort)
		}
		if !https {
			bad("%s cannot reach the order API or the IdP on 443", name)
		}
	}
	return out
}

// peerName names a peer by its selectors' labels and its address block,
// in a stable form: ns{k=v,…} for the namespaces (none: the policy's
// own), pods{k=v,…} for their pods, ip{cidr except …}. A selector with
// expressions, which the check does not read, is named as such, so that
// it matches no wanted peer.
func peerName(p networkingv1.NetworkPolicyPeer) string {
	var parts []string
	sel := func(kind string, s *metav1.LabelSelector) {
		if s == nil {
			return
		}
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(s.MatchLabels)) {
			kv = append(kv, k+"="+s.MatchLabels[k])
		}
		if len(s.MatchExpressions) > 0 {
			kv = append(kv, "expressions")
		}
		parts = append(parts, kind+"{"+strings.Join(kv, ",")+"}")
	}
	sel("ns", p.NamespaceSelector)
	sel("pods", p.PodSelector)
	if b := p.IPBlock; b != nil {
		parts = append(parts, "ip{"+strings.Join(append([]string{b.CIDR}, b.Except...), " except ")+"}")
	}
	return strings.Join(parts, " ")
}

// openPeer returns why a peer is open to more than the rules mean, or "":
// an empty namespace selector without a pod selector (every pod of every
// namespace), or an address block that holds the metadata address (not
// excepted) or is unreadable.
func openPeer(p networkingv1.NetworkPolicyPeer) string {
	if ns := p.NamespaceSelector; ns != nil && len(ns.MatchLabels) == 0 && len(ns.MatchExpressions) == 0 &&
		(p.PodSelector == nil || len(p.PodSelector.MatchLabels) == 0 && len(p.PodSelector.MatchExpressions) == 0) {
		return "every pod of every namespace"
	}
	b := p.IPBlock
	if b == nil {
		return ""
	}
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return fmt.Sprintf("an unreadable address block %q", b.CIDR)
	}
	if !cidr.Contains(metadataAddr) {
		return ""
	}
	for _, e := range b.Except {
		if ex, err := netip.ParsePrefix(e); err == nil && ex.Contains(metadataAddr) {
			return ""
		}
	}
	return fmt.Sprintf("%s, which holds the metadata address %s", b.CIDR, metadataAddr)
}

// TestNetworkPolicyCheckFails proves that networkProblems finds what it
// is for, on the rendered policies with one thing changed each.
func TestNetworkPolicyCheckFails(t *testing.T) {
	objs := renderOverlay(t, "overlays/keda")
	deployments := map[string]*appsv1.Deployment{}
	var nps []*networkingv1.NetworkPolicy
	for _, o := range objs {
		switch v := o.value.(type) {
		case *appsv1.Deployment:
			deployments[o.name] = v
		case *networkingv1.NetworkPolicy:
			nps = append(nps, v)
		}
	}
	if p := networkProblems(nps, deployments, 6379); len(p) > 0 {
		t.Fatalf("the manifests' policies have problems: %q", p)
	}
	named := func(nps []*networkingv1.NetworkPolicy, name string) *networkingv1.NetworkPolicy {
		for _, np := range nps {
			if np.Name == name {
				return np
			}
		}
		t.Fatalf("no NetworkPolicy %s", name)
		return nil
	}
	tests := []struct {
		name, want string
		edit       func(nps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy
	}{
		{"intake open to every source", "orderworker-intake, ingress rule 1: from 0 peers", func(nps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			named(nps, "orderworker-intake").Spec.Ingress[0].From = nil
			return nps
		}},
		{"dashboard open to every namespace", `orderworker-dashboard takes traffic from ["ns{}"`, func(nps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			named(nps, "orderworker-dashboard").Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}
			return nps
		}},
		{"egress to every address", "0.0.0.0/0, which holds the metadata address", func(nps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			named(nps, "orderworker-egress-order-api").Spec.Egress[0].To[0].IPBlock.CIDR = "0.0.0.0/0"
			return nps
		}},
		{"no egress policy", "orderworker-worker is under no Egress policy", func(nps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			var out []*networkingv1.NetworkPolicy
			for _, np := range nps {
				np.Spec.PolicyTypes = slices.DeleteFunc(np.Spec.PolicyTypes, func(pt networkingv1.PolicyType) bool { return pt == networkingv1.PolicyTypeEgress })
				if len(np.Spec.PolicyTypes) > 0 {
					out = append(out, np)
				}
			}
			return out
		}},
		{"no DNS", "cannot reach " + kubeDNS + " 53/UDP", func(nps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
			e := named(nps, "orderworker-egress")
			e.Spec.Egress = e.Spec.Egress[1:]
			return nps
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			copies := make([]*networkingv1.NetworkPolicy, len(nps))
			for i, np := range nps {
				copies[i] = np.DeepCopy()
			}
			problems := networkProblems(tt.edit(copies), deployments, 6379)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("no problem says %q; got %q", tt.want, problems)
			}
		})
	}
}
