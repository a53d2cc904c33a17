package compat

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"
)

// adminDo sends one admin REST request to the broker's web port and returns the
// status and body. path starts with "/admin/v2/...".
func adminDo(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, webURL(t)+path, rd)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	hc := &http.Client{Timeout: 15 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// adminOK is adminDo that requires a 2xx answer.
func adminOK(t *testing.T, method, path, body string) string {
	t.Helper()
	status, reply := adminDo(t, method, path, body)
	if status < 200 || status > 299 {
		t.Fatalf("%s %s answered %d %q, want 2xx", method, path, status, reply)
	}
	return reply
}

// namespaceTopics is `GET /admin/v2/persistent/public/default` (partitions included) or,
// with partitioned, `.../partitioned` (partitioned topics by their base name).
func namespaceTopics(t *testing.T, partitioned bool) []string {
	t.Helper()
	path := "/admin/v2/persistent/public/default"
	if partitioned {
		path += "/partitioned"
	}
	body := adminOK(t, "GET", path, "")
	var topics []string
	if err := json.Unmarshal([]byte(body), &topics); err != nil {
		t.Fatalf("GET %s: not a JSON list of names: %q (%v)", path, body, err)
	}
	return topics
}

// localName turns persistent://public/default/x into x.
func localName(topic string) string {
	return topic[strings.LastIndex(topic, "/")+1:]
}

// createPartitioned creates a partitioned topic with the admin API.
func createPartitioned(t *testing.T, topic string, n int) {
	t.Helper()
	adminOK(t, "PUT", "/admin/v2/persistent/public/default/"+localName(topic)+"/partitions", strconv.Itoa(n))
}

// closableClient is a client the test closes itself (to show what happens after a
// client goes away); it is also closed at the end of the test, at most once.
type closableClient struct {
	pulsar.Client
	once sync.Once
}

func (c *closableClient) Close() { c.once.Do(c.Client.Close) }

func newClientURL(t *testing.T, url string) *closableClient {
	t.Helper()
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	c, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:               url,
		ConnectionTimeout: 5 * time.Second,
		OperationTimeout:  15 * time.Second,
		Logger:            plog.NewLoggerWithLogrus(logger),
	})
	if err != nil {
		t.Fatalf("client for %s: %v", url, err)
	}
	cc := &closableClient{Client: c}
	t.Cleanup(cc.Close)
	return cc
}

// within runs f in a goroutine and fails the test if it does not return within d
// (a call the broker leaves unanswered must not hang the test).
func within(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(d):
		t.Fatalf("%s did not complete within %v", what, d)
	}
}
