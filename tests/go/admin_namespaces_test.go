package compat

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/apache/pulsar-client-go/pulsaradmin"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/utils"
)

// newAdmin returns the official Go admin client (pulsaradmin) for the broker's web port.
func newAdmin(t *testing.T) pulsaradmin.Client {
	t.Helper()
	client, err := pulsaradmin.NewClient(&pulsaradmin.Config{WebServiceURL: webURL(t)})
	if err != nil {
		t.Fatalf("pulsaradmin.NewClient: %v", err)
	}
	return client
}

// freshNamespace creates public/<prefix>-<random> and deletes it (forced) when the test ends.
func freshNamespace(t *testing.T, admin pulsaradmin.Client, prefix string) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "public/" + prefix + "-" + hex.EncodeToString(b)
	if err := admin.Namespaces().CreateNamespace(ns); err != nil {
		t.Fatalf("CreateNamespace(%s): %v", ns, err)
	}
	t.Cleanup(func() { _ = admin.Namespaces().DeleteNamespace(ns) })
	return ns
}

// Namespace retention, message TTL and backlog quotas through pulsaradmin: set, read back,
// Pulsar's refusals (negative TTL, a quota above the retention size), remove.
func TestAdminNamespacePolicies(t *testing.T) {
	admin := newAdmin(t)
	ns := freshNamespace(t, admin, "go-policies")
	nss := admin.Namespaces()

	// Retention.
	if err := nss.SetRetention(ns, utils.NewRetentionPolicies(60, 100)); err != nil {
		t.Fatalf("SetRetention: %v", err)
	}
	got, err := nss.GetRetention(ns)
	if err != nil || got == nil || got.RetentionTimeInMinutes != 60 || got.RetentionSizeInMB != 100 {
		t.Fatalf("GetRetention = %+v, %v; want 60 min / 100 MB", got, err)
	}
	if err := nss.SetRetention(ns, utils.NewRetentionPolicies(0, 100)); err == nil {
		t.Fatalf("SetRetention(0 min, 100 MB) succeeded; Pulsar refuses a single zero limit")
	}

	// Message TTL.
	if err := nss.SetNamespaceMessageTTL(ns, 90); err != nil {
		t.Fatalf("SetNamespaceMessageTTL: %v", err)
	}
	if ttl, err := nss.GetNamespaceMessageTTL(ns); err != nil || ttl != 90 {
		t.Fatalf("GetNamespaceMessageTTL = %d, %v; want 90", ttl, err)
	}
	err = nss.SetNamespaceMessageTTL(ns, -1)
	if err == nil || !strings.Contains(err.Error(), "Invalid value for message TTL") {
		t.Fatalf("SetNamespaceMessageTTL(-1) = %v; want Pulsar's 412", err)
	}
	if err := nss.RemoveNamespaceMessageTTL(ns); err != nil {
		t.Fatalf("RemoveNamespaceMessageTTL: %v", err)
	}

	// Backlog quotas: a size quota must stay below the 100 MB retention.
	tooBig := utils.NewBacklogQuota(200<<20, -1, utils.ProducerRequestHold)
	err = nss.SetBacklogQuota(ns, tooBig, utils.DestinationStorage)
	if err == nil || !strings.Contains(err.Error(), "Backlog Quota exceeds configured retention quota") {
		t.Fatalf("SetBacklogQuota(200 MB) = %v; want Pulsar's 412", err)
	}
	if err := nss.SetBacklogQuota(ns, utils.NewBacklogQuota(10<<20, -1, utils.ProducerException),
		utils.DestinationStorage); err != nil {
		t.Fatalf("SetBacklogQuota(destination_storage): %v", err)
	}
	if err := nss.SetBacklogQuota(ns, utils.NewBacklogQuota(-1, 600, utils.ConsumerBacklogEviction),
		utils.MessageAge); err != nil {
		t.Fatalf("SetBacklogQuota(message_age): %v", err)
	}
	quotas, err := nss.GetBacklogQuotaMap(ns)
	if err != nil {
		t.Fatalf("GetBacklogQuotaMap: %v", err)
	}
	size, age := quotas[utils.DestinationStorage], quotas[utils.MessageAge]
	if size.LimitSize != 10<<20 || size.Policy != utils.ProducerException ||
		age.LimitTime != 600 || age.Policy != utils.ConsumerBacklogEviction {
		t.Fatalf("GetBacklogQuotaMap = %+v", quotas)
	}
	if err := nss.RemoveBacklogQuota(ns); err != nil {
		t.Fatalf("RemoveBacklogQuota: %v", err)
	}
	quotas, err = nss.GetBacklogQuotaMap(ns)
	if _, still := quotas[utils.DestinationStorage]; err != nil || still || len(quotas) != 1 {
		t.Fatalf("after RemoveBacklogQuota: %+v, %v; want only message_age", quotas, err)
	}

	// Topic level: the topic's own TTL, and the applied retention from the namespace.
	topic, err := utils.GetTopicName("persistent://" + ns + "/go-topic-policies")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Topics().Create(*topic, 0); err != nil {
		t.Fatalf("create %s: %v", topic, err)
	}
	if err := admin.Topics().SetMessageTTL(*topic, 33); err != nil {
		t.Fatalf("topic SetMessageTTL: %v", err)
	}
	if ttl, err := admin.Topics().GetMessageTTL(*topic); err != nil || ttl != 33 {
		t.Fatalf("topic GetMessageTTL = %d, %v; want 33", ttl, err)
	}
	applied, err := admin.Topics().GetRetention(*topic, true)
	if err != nil || applied == nil || applied.RetentionTimeInMinutes != 60 {
		t.Fatalf("topic GetRetention(applied) = %+v, %v; want the namespace's 60 min", applied, err)
	}
	if err := admin.Topics().Delete(*topic, true, true); err != nil {
		t.Fatalf("delete %s: %v", topic, err)
	}
}
