//go:build brokers

package compat

// The official Go client through `magnetar proxy`: tests/compat/test_proxy.py starts etcd,
// storage nodes, two brokers and the proxy, creates a namespace of four bundles, and runs this
// test with
//
//	MAGNETAR_TEST_PROXY_URL    pulsar://host:port of the proxy (the only URL the client gets)
//	MAGNETAR_TEST_WEB_URLS     http://host:port of each broker's admin API
//	MAGNETAR_TEST_NAMESPACE    tenant/namespace

import (
	"fmt"
	"os"
	"testing"
)

func TestTheProxyIsOneAddressForEveryBroker(t *testing.T) {
	proxy := os.Getenv("MAGNETAR_TEST_PROXY_URL")
	webs := brokerList(t, "MAGNETAR_TEST_WEB_URLS")
	ns := os.Getenv("MAGNETAR_TEST_NAMESPACE")
	if proxy == "" || ns == "" {
		t.Fatalf("a proxy URL and a namespace expected: %q %q", proxy, ns)
	}
	owners := map[string]bool{}
	for i := 0; i < 8; i++ {
		topic := fmt.Sprintf("persistent://%s/go-proxied-%d", ns, i)
		produceAndConsume(t, proxy, topic, 5)
		owners[ownerAt(t, webs[0], topic)] = true
	}
	// Which brokers own them is the load manager's choice (the Python twin checks that both
	// are reached); each was reached through the proxy, the only address the client had.
	t.Logf("8 topics over %d brokers, produced and consumed through the proxy", len(owners))
}
