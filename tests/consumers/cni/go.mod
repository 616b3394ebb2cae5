// The CNI plugins of the real-node test (tests/kube/kubelet.py): the node's containerd gives each
// Pod sandbox a loopback and a veth on a bridge of the test's own, its address from host-local.
// The release Kubernetes 1.33's node e2e tests install (test/e2e_node/remote/utils.go,
// cniVersion), so it moves with ../kube.
module imagegate.test/consumers/cni

go 1.26.0

tool (
	github.com/containernetworking/plugins/plugins/ipam/host-local
	github.com/containernetworking/plugins/plugins/main/bridge
	github.com/containernetworking/plugins/plugins/main/loopback
)

require (
	github.com/alexflint/go-filemutex v1.3.0 // indirect
	github.com/containernetworking/cni v1.2.3 // indirect
	github.com/containernetworking/plugins v1.6.2 // indirect
	github.com/coreos/go-iptables v0.8.0 // indirect
	github.com/networkplumbing/go-nft v0.4.0 // indirect
	github.com/safchain/ethtool v0.5.9 // indirect
	github.com/vishvananda/netlink v1.3.0 // indirect
	github.com/vishvananda/netns v0.0.4 // indirect
	golang.org/x/sys v0.27.0 // indirect
	sigs.k8s.io/knftables v0.0.18 // indirect
)
