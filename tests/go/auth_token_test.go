//go:build authtoken

package compat

// The Go client with a JWT (pulsar.NewAuthenticationToken) against a broker with
// authentication on; a bad token is refused. Behind the `authtoken` build tag: it needs a
// broker of its own (tests/compat/test_auth_go.py starts one and passes the tokens in
// MAGNETAR_TEST_TOKEN and MAGNETAR_TEST_BAD_TOKEN; with MAGNETAR_TEST_TLS_CA set the service
// URL is pulsar+ssl:// and the client verifies the broker with that CA).

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// tokenOptions: the client options for `token`, over TLS when MAGNETAR_TEST_TLS_CA is set.
func tokenOptions(t *testing.T, token string, timeout time.Duration) pulsar.ClientOptions {
	return pulsar.ClientOptions{
		URL:                   serviceURL(t),
		ConnectionTimeout:     timeout / 2,
		OperationTimeout:      timeout,
		Authentication:        pulsar.NewAuthenticationToken(token),
		TLSTrustCertsFilePath: os.Getenv("MAGNETAR_TEST_TLS_CA"),
		TLSValidateHostname:   os.Getenv("MAGNETAR_TEST_TLS_CA") != "",
	}
}

func tokenClient(t *testing.T, token string) pulsar.Client {
	t.Helper()
	c, err := pulsar.NewClient(tokenOptions(t, token, 10*time.Second))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestTokenAuthentication(t *testing.T) {
	token := os.Getenv("MAGNETAR_TEST_TOKEN")
	bad := os.Getenv("MAGNETAR_TEST_BAD_TOKEN")
	if token == "" || bad == "" {
		t.Fatalf("MAGNETAR_TEST_TOKEN and MAGNETAR_TEST_BAD_TOKEN must be set (run through tests/compat/test_auth_go.py)")
	}
	c := tokenClient(t, token)
	topic := uniqueTopic("go-auth")
	consumer, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer consumer.Close()
	producer, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer producer.Close()
	ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
	defer cancel()
	if _, err := producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("with a token")}); err != nil {
		t.Fatalf("send: %v", err)
	}
	msg, err := consumer.Receive(ctx)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	if string(msg.Payload()) != "with a token" {
		t.Fatalf("got %q", msg.Payload())
	}

	// The broker refuses the CONNECT (ERROR AuthenticationError, then close, as Pulsar); the
	// Go client sees a closed connection and gives up at its operation timeout.
	badClient, err := pulsar.NewClient(tokenOptions(t, bad, 3*time.Second))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer badClient.Close()
	if p, err := badClient.CreateProducer(pulsar.ProducerOptions{Topic: topic}); err == nil {
		p.Close()
		t.Fatalf("a producer with an expired token was created")
	}
}
