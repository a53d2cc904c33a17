//go:build tls

package compat

// The Go client over TLS (pulsar+ssl://, TLSTrustCertsFilePath, TLSValidateHostname, mTLS with
// NewAuthenticationTLS). tests/compat/test_tls_go.py starts brokers with [tls] and certificates
// it made, and runs these tests with:
//
//	MAGNETAR_TEST_TLS_SERVICE_URL  pulsar+ssl://127.0.0.1:port
//	MAGNETAR_TEST_TLS_CA           PEM of the CA that signed the server certificate
//	MAGNETAR_TEST_TLS_CLIENT_CERT, MAGNETAR_TEST_TLS_CLIENT_KEY  a client certificate of that CA
//
// The build tag keeps them out of the plain `go test ./...` run (test_go_client.py).

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"
)

func tlsEnv(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set (run through tests/compat/test_tls_go.py)", name)
	}
	return v
}

func tlsClient(t *testing.T, validateHostname bool, auth pulsar.Authentication) pulsar.Client {
	t.Helper()
	logger := logrus.New()
	logger.SetLevel(logrus.ErrorLevel)
	c, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:                   tlsEnv(t, "MAGNETAR_TEST_TLS_SERVICE_URL"),
		TLSTrustCertsFilePath: tlsEnv(t, "MAGNETAR_TEST_TLS_CA"),
		TLSValidateHostname:   validateHostname,
		Authentication:        auth,
		ConnectionTimeout:     4 * time.Second,
		OperationTimeout:      8 * time.Second,
		Logger:                plog.NewLoggerWithLogrus(logger),
	})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// tlsRoundTrip produces 3 messages on a new topic and consumes them.
func tlsRoundTrip(c pulsar.Client) error {
	topic := uniqueTopic("tls")
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	defer cons.Close()
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		if _, err := prod.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m-%d", i))}); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}
	for i := 0; i < 3; i++ {
		m, err := cons.Receive(ctx)
		if err != nil {
			return fmt.Errorf("receive %d: %w", i, err)
		}
		if want := fmt.Sprintf("m-%d", i); string(m.Payload()) != want {
			return fmt.Errorf("received %q, want %q", m.Payload(), want)
		}
		_ = cons.Ack(m)
	}
	return nil
}

// TestTLSClientCertRequired: a broker with a matching server certificate that requires a
// trusted client certificate. With one, produce/consume works with hostname verification on
// and off; without one, the connection is refused.
func TestTLSClientCertRequired(t *testing.T) {
	cert, key := tlsEnv(t, "MAGNETAR_TEST_TLS_CLIENT_CERT"), tlsEnv(t, "MAGNETAR_TEST_TLS_CLIENT_KEY")
	for _, validate := range []bool{true, false} {
		auth := pulsar.NewAuthenticationTLS(cert, key)
		if err := tlsRoundTrip(tlsClient(t, validate, auth)); err != nil {
			t.Fatalf("TLSValidateHostname=%v with a client certificate: %v", validate, err)
		}
	}
	if err := tlsRoundTrip(tlsClient(t, true, nil)); err == nil {
		t.Fatalf("admitted without a client certificate")
	}
}

// TestTLSHostnameMismatch: a broker whose certificate names another host (signed by the
// trusted CA): refused with hostname verification; served when the client skips verification
// (TLSAllowInsecureConnection). Unlike the C++ and Java clients, the Go client checks the name
// even with TLSValidateHostname=false: it dials with crypto/tls's DialWithDialer, which takes
// the server name from the address when none is set, so that case is not a test of the broker.
func TestTLSHostnameMismatch(t *testing.T) {
	if err := tlsRoundTrip(tlsClient(t, true, nil)); err == nil {
		t.Fatalf("a certificate for another host accepted with TLSValidateHostname")
	}
	logger := logrus.New()
	logger.SetLevel(logrus.ErrorLevel)
	insecure, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:                        tlsEnv(t, "MAGNETAR_TEST_TLS_SERVICE_URL"),
		TLSAllowInsecureConnection: true,
		ConnectionTimeout:          4 * time.Second,
		OperationTimeout:           8 * time.Second,
		Logger:                     plog.NewLoggerWithLogrus(logger),
	})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(insecure.Close)
	if err := tlsRoundTrip(insecure); err != nil {
		t.Fatalf("TLSAllowInsecureConnection: %v", err)
	}
}
