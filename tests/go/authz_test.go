//go:build authz

package compat

// Authorization seen by the Go client (issue 17). Run by tests/compat/test_authorization.py
// against a broker of its own with token authentication and authorization, with
// `go test -tags authz -run TestAuthz`; left out of the plain Go suite (it needs that broker).
//
// MAGNETAR_TEST_SERVICE_URL / MAGNETAR_TEST_WEB_URL: the broker; MAGNETAR_AUTHZ_READER_TOKEN:
// a role with only `consume` on MAGNETAR_AUTHZ_TOPIC's namespace; MAGNETAR_AUTHZ_OTHER_PATH: an
// admin path of another tenant, which the same role must be refused (403).

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

func authzEnv(t *testing.T, name string) string {
	t.Helper()
	value := os.Getenv(name)
	if value == "" {
		t.Fatalf("%s is not set", name)
	}
	return value
}

func TestAuthzGoClient(t *testing.T) {
	token := authzEnv(t, "MAGNETAR_AUTHZ_READER_TOKEN")
	topic := authzEnv(t, "MAGNETAR_AUTHZ_TOPIC")
	client, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:               authzEnv(t, "MAGNETAR_TEST_SERVICE_URL"),
		Authentication:    pulsar.NewAuthenticationToken(token),
		OperationTimeout:  10 * time.Second,
		ConnectionTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer client.Close()

	// Only consume: a producer is refused with AuthorizationError.
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err == nil {
		producer.Close()
		t.Fatalf("a consume-only role created a producer on %s", topic)
	}
	if !strings.Contains(err.Error(), "AuthorizationError") {
		t.Fatalf("producer refused with %v, want AuthorizationError", err)
	}

	// ...and may consume.
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "go"})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	consumer.Close()

	// The admin API refuses it another tenant's namespace: 403 with a reason.
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet,
		authzEnv(t, "MAGNETAR_TEST_WEB_URL")+authzEnv(t, "MAGNETAR_AUTHZ_OTHER_PATH"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "reason") {
		t.Fatalf("admin answered %d %q, want 403 with a reason", resp.StatusCode, body)
	}
}
