//! Authorization: who may do what, decided as Apache Pulsar's `PulsarAuthorizationProvider`
//! and `AuthorizationService` decide.
//!
//! This module is the pure decision core: plain functions over the facts (the caller's role,
//! the configuration's super-users, the tenant's `adminRoles`, the namespace document's
//! `auth_policies` and `subscription_auth_mode`). Reading those facts from the metadata store,
//! caching them and enforcing the decisions is the broker's and the admin API's business.
//!
//! The rules (Pulsar's):
//! - authorization disabled: everything is allowed;
//! - no role (authentication disabled, no anonymous role): nothing is allowed while
//!   authorization is enabled (fail closed);
//! - a super-user (`super_user_roles`) may do everything;
//! - a tenant admin (the tenant's `adminRoles`) may do every tenant, namespace, namespace
//!   policy, topic and topic policy operation of that tenant (Pulsar's `validateTenantAdminAccess`
//!   before the per-operation switch);
//! - produce: the role has `produce` in `namespace_auth` or in the topic's `destination_auth`;
//! - consume: the same with `consume`, and when a subscription is named, its
//!   `subscription_auth_roles` entry (if non-empty) must list the role, and with
//!   `subscription_auth_mode: Prefix` the subscription must start with the role;
//! - lookup: produce or consume (without a subscription);
//! - namespace `GET_TOPICS` / `GET_TOPIC` / `GET_BUNDLE`: `produce` or `consume` at namespace
//!   level; `UNSUBSCRIBE` / `CLEAR_BACKLOG`: `consume` at namespace level; `PACKAGES` /
//!   `FUNCTIONS` / `SOURCES` / `SINKS`: that action at namespace level; the rest: tenant admin;
//! - wildcard roles (`prefix*`, `*suffix` in a permission map) only when
//!   `allow_wildcards_matching` is on (off by default, as Pulsar's
//!   `authorizationAllowWildcardsMatching`).

use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The `[authorization]` section of the server configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthorizationConfig {
    /// Enforce permissions on the binary protocol and the admin API. Default false.
    pub enabled: bool,
    /// Roles that may do everything (Pulsar's `superUserRoles`). Default empty.
    pub super_user_roles: Vec<String>,
    /// Permission maps may name roles by `prefix*` / `*suffix` (Pulsar's
    /// `authorizationAllowWildcardsMatching`). Default false.
    pub allow_wildcards_matching: bool,
    /// Roles of proxies (Pulsar's `proxyRoles`): a connection authenticated as one of them acts
    /// for the client its CONNECT names in `original_principal`, whose role is authorized.
    /// Default empty: `original_principal` is ignored.
    pub proxy_roles: Vec<String>,
}

/// Why a request was refused; the text is what the client is told.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Denied(pub String);

/// The outcome of a decision.
pub type Decision = Result<(), Denied>;

/// An action a namespace or topic permission grants (Pulsar's `AuthAction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AuthAction {
    Produce,
    Consume,
    Functions,
    Sources,
    Sinks,
    Packages,
}

impl AuthAction {
    /// Every action, as Pulsar spells them.
    pub const ALL: [AuthAction; 6] = [
        AuthAction::Produce,
        AuthAction::Consume,
        AuthAction::Functions,
        AuthAction::Sources,
        AuthAction::Sinks,
        AuthAction::Packages,
    ];

    /// The wire name (`produce`, `consume`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            AuthAction::Produce => "produce",
            AuthAction::Consume => "consume",
            AuthAction::Functions => "functions",
            AuthAction::Sources => "sources",
            AuthAction::Sinks => "sinks",
            AuthAction::Packages => "packages",
        }
    }

    /// Parses a wire name; `None` for anything else.
    pub fn parse(name: &str) -> Option<AuthAction> {
        AuthAction::ALL.into_iter().find(|a| a.as_str() == name)
    }
}

impl fmt::Display for AuthAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// role → actions, as stored (unknown action names are kept as strings and never match).
pub type RoleActions = BTreeMap<String, BTreeSet<String>>;

/// A namespace's `auth_policies` (Pulsar's `AuthPolicies`), as stored in its policies document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct AuthPolicies {
    /// role → actions on every topic of the namespace.
    pub namespace_auth: RoleActions,
    /// topic (full name, `persistent://t/ns/x`) → role → actions.
    pub destination_auth: BTreeMap<String, RoleActions>,
    /// subscription → roles allowed to use it (empty or absent: any role with `consume`).
    pub subscription_auth_roles: BTreeMap<String, BTreeSet<String>>,
}

/// Pulsar's `SubscriptionAuthMode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum SubscriptionAuthMode {
    /// Any subscription name.
    #[default]
    None,
    /// The subscription name must start with the consumer's role.
    Prefix,
}

/// What authorization needs from a namespace's policies document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct NamespaceAuth {
    pub auth_policies: AuthPolicies,
    pub subscription_auth_mode: SubscriptionAuthMode,
}

impl NamespaceAuth {
    /// Reads the authorization fields of a stored namespace policies document (JSON). A
    /// malformed `auth_policies` is an error (the caller refuses rather than guesses).
    pub fn from_policies_json(bytes: &[u8]) -> Result<NamespaceAuth, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// A tenant operation (Pulsar's `TenantOperation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantOperation {
    CreateNamespace,
    DeleteNamespace,
    ListNamespaces,
}

/// A namespace operation (Pulsar's `NamespaceOperation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceOperation {
    CreateTopic,
    GetTopic,
    GetTopics,
    DeleteTopic,
    AddBundle,
    DeleteBundle,
    GetBundle,
    GetPermission,
    GrantPermission,
    RevokePermission,
    ClearBacklog,
    Unsubscribe,
    Packages,
    Functions,
    Sources,
    Sinks,
}

/// A topic operation (Pulsar's `TopicOperation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopicOperation {
    Lookup,
    Produce,
    GetStats,
    GetMetadata,
    Consume,
    Subscribe,
    GetSubscriptions,
    Unsubscribe,
    Skip,
    ExpireMessages,
    PeekMessages,
    ResetCursor,
    GetBacklogSize,
    Terminate,
    Compact,
    Offload,
    Unload,
    DeleteMetadata,
    UpdateMetadata,
    GetPermission,
    GrantPermission,
    RevokePermission,
}

/// Read or write of a policy (Pulsar's `PolicyOperation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyOperation {
    Read,
    Write,
}

/// The facts one decision is taken on.
#[derive(Clone, Copy, Debug, Default)]
pub struct Facts<'a> {
    /// The caller's role; `None` when nobody is authenticated.
    pub role: Option<&'a str>,
    /// The tenant's `adminRoles`; `None` when the tenant does not exist.
    pub tenant_admin_roles: Option<&'a [String]>,
    /// The namespace's authorization policies; `None` when the namespace does not exist.
    pub namespace: Option<&'a NamespaceAuth>,
}

impl AuthorizationConfig {
    /// `role` is a super-user.
    pub fn is_super_user(&self, role: &str) -> bool {
        self.super_user_roles.iter().any(|r| r == role)
    }

    /// Common prelude: `Ok(Some(role))` when the decision must look further, `Ok(None)` when
    /// it is allowed outright (authorization off, or a super-user).
    fn subject<'a>(&self, facts: &Facts<'a>) -> Result<Option<&'a str>, Denied> {
        if !self.enabled {
            return Ok(None);
        }
        let Some(role) = facts.role else {
            return Err(Denied("Authentication required".to_string()));
        };
        if self.is_super_user(role) {
            return Ok(None);
        }
        Ok(Some(role))
    }

    /// Super-user only operations (clusters, tenants create/delete/list, brokers).
    pub fn allow_super_user(&self, facts: &Facts<'_>) -> Decision {
        match self.subject(facts)? {
            None => Ok(()),
            Some(role) => Err(Denied(format!("{role} is not a super-user"))),
        }
    }

    /// Whether `role` (not a super-user) is an admin of the tenant.
    fn tenant_admin(&self, role: &str, facts: &Facts<'_>) -> bool {
        facts.tenant_admin_roles.is_some_and(|admins| {
            admins.iter().any(|a| a == role)
                || (self.allow_wildcards_matching && admins.iter().any(|a| wildcard(a, role)))
        })
    }

    /// Tenant admin (or super-user) operations; Pulsar's `validateTenantAdminAccess`.
    pub fn allow_tenant_admin(&self, facts: &Facts<'_>) -> Decision {
        match self.subject(facts)? {
            None => Ok(()),
            Some(role) if self.tenant_admin(role, facts) => Ok(()),
            Some(role) => Err(Denied(format!("{role} is not a tenant admin"))),
        }
    }

    /// Pulsar's `allowTenantOperation`: tenant admins.
    pub fn allow_tenant_operation(&self, facts: &Facts<'_>, _op: TenantOperation) -> Decision {
        self.allow_tenant_admin(facts)
    }

    /// Pulsar's `allowNamespacePolicyOperation`: tenant admins.
    pub fn allow_namespace_policy_operation(
        &self,
        facts: &Facts<'_>,
        _op: PolicyOperation,
    ) -> Decision {
        self.allow_tenant_admin(facts)
    }

    /// Pulsar's `allowTopicPolicyOperation`: tenant admins.
    pub fn allow_topic_policy_operation(
        &self,
        facts: &Facts<'_>,
        _op: PolicyOperation,
    ) -> Decision {
        self.allow_tenant_admin(facts)
    }

    /// Whether `role` holds `action` in a role → actions map (exact, then by wildcard).
    fn holds(&self, map: &RoleActions, role: &str, action: AuthAction) -> bool {
        if map.get(role).is_some_and(|actions| actions.contains(action.as_str())) {
            return true;
        }
        self.allow_wildcards_matching
            && map.iter().any(|(granted, actions)| {
                actions.contains(action.as_str()) && wildcard(granted, role)
            })
    }

    /// `action` at namespace level.
    fn namespace_grants(&self, facts: &Facts<'_>, role: &str, action: AuthAction) -> bool {
        facts.namespace.is_some_and(|ns| self.holds(&ns.auth_policies.namespace_auth, role, action))
    }

    /// `action` on `topic` (namespace level or the topic's own permissions). Pulsar's
    /// `checkPermission`. A partition's permissions are its partitioned topic's.
    fn topic_grants(&self, facts: &Facts<'_>, role: &str, topic: &str, action: AuthAction) -> bool {
        let Some(ns) = facts.namespace else { return false };
        if self.holds(&ns.auth_policies.namespace_auth, role, action) {
            return true;
        }
        let base = partitioned_base(topic);
        [topic, base].iter().any(|t| {
            ns.auth_policies.destination_auth.get(*t).is_some_and(|m| self.holds(m, role, action))
        })
    }

    fn produce_check(&self, facts: &Facts<'_>, role: &str, topic: &str) -> Decision {
        if self.topic_grants(facts, role, topic, AuthAction::Produce) {
            return Ok(());
        }
        Err(Denied(format!("{role} is not authorized to produce on topic {topic}")))
    }

    fn consume_check(
        &self,
        facts: &Facts<'_>,
        role: &str,
        topic: &str,
        subscription: Option<&str>,
    ) -> Decision {
        if let (Some(ns), Some(sub)) = (facts.namespace, subscription.filter(|s| !s.is_empty())) {
            if let Some(roles) = ns.auth_policies.subscription_auth_roles.get(sub) {
                if !roles.is_empty() && !roles.contains(role) {
                    return Err(Denied(format!(
                        "{role} is not authorized to access subscription {sub} on topic {topic}"
                    )));
                }
            }
            if ns.subscription_auth_mode == SubscriptionAuthMode::Prefix && !sub.starts_with(role) {
                return Err(Denied(format!(
                    "The subscription name needs to be prefixed by the authentication role, like \
                     {role}-xxxx for topic: {topic}"
                )));
            }
        }
        if self.topic_grants(facts, role, topic, AuthAction::Consume) {
            return Ok(());
        }
        Err(Denied(format!("{role} is not authorized to consume from topic {topic}")))
    }

    /// Pulsar's `canProduce`.
    pub fn can_produce(&self, facts: &Facts<'_>, topic: &str) -> Decision {
        self.allow_topic_operation(facts, topic, TopicOperation::Produce, None)
    }

    /// Pulsar's `canConsume` (with the subscription's own permission).
    pub fn can_consume(
        &self,
        facts: &Facts<'_>,
        topic: &str,
        subscription: Option<&str>,
    ) -> Decision {
        self.allow_topic_operation(facts, topic, TopicOperation::Consume, subscription)
    }

    /// Pulsar's `canLookup`: produce or consume.
    pub fn can_lookup(&self, facts: &Facts<'_>, topic: &str) -> Decision {
        self.allow_topic_operation(facts, topic, TopicOperation::Lookup, None)
    }

    /// Pulsar's `allowTopicOperation`: super-users and tenant admins, else by operation.
    pub fn allow_topic_operation(
        &self,
        facts: &Facts<'_>,
        topic: &str,
        op: TopicOperation,
        subscription: Option<&str>,
    ) -> Decision {
        let Some(role) = self.subject(facts)? else { return Ok(()) };
        if self.tenant_admin(role, facts) {
            return Ok(());
        }
        use TopicOperation as T;
        match op {
            T::Lookup | T::GetStats | T::GetMetadata => {
                if self.produce_check(facts, role, topic).is_ok()
                    || self.consume_check(facts, role, topic, None).is_ok()
                {
                    Ok(())
                } else {
                    Err(Denied(format!("{role} is not authorized to look up topic {topic}")))
                }
            }
            T::Produce => self.produce_check(facts, role, topic),
            T::Consume
            | T::Subscribe
            | T::GetSubscriptions
            | T::Unsubscribe
            | T::Skip
            | T::ExpireMessages
            | T::PeekMessages
            | T::ResetCursor
            | T::GetBacklogSize => self.consume_check(facts, role, topic, subscription),
            T::Terminate
            | T::Compact
            | T::Offload
            | T::Unload
            | T::DeleteMetadata
            | T::UpdateMetadata
            | T::GetPermission
            | T::GrantPermission
            | T::RevokePermission => {
                Err(Denied(format!("{role} is not a tenant admin (topic {topic})")))
            }
        }
    }

    /// Pulsar's `allowNamespaceOperation`: super-users and tenant admins, else by operation.
    pub fn allow_namespace_operation(&self, facts: &Facts<'_>, op: NamespaceOperation) -> Decision {
        let Some(role) = self.subject(facts)? else { return Ok(()) };
        if self.tenant_admin(role, facts) {
            return Ok(());
        }
        use NamespaceOperation as N;
        let needs: &[AuthAction] = match op {
            N::GetTopic | N::GetTopics | N::GetBundle => {
                &[AuthAction::Produce, AuthAction::Consume]
            }
            N::Unsubscribe | N::ClearBacklog => &[AuthAction::Consume],
            N::Packages => &[AuthAction::Packages],
            N::Functions => &[AuthAction::Functions],
            N::Sources => &[AuthAction::Sources],
            N::Sinks => &[AuthAction::Sinks],
            N::CreateTopic
            | N::DeleteTopic
            | N::AddBundle
            | N::DeleteBundle
            | N::GetPermission
            | N::GrantPermission
            | N::RevokePermission => &[],
        };
        if needs.iter().any(|action| self.namespace_grants(facts, role, *action)) {
            return Ok(());
        }
        Err(Denied(format!("{role} is not authorized for {op:?} on this namespace")))
    }
}

/// `pattern` (`prefix*` or `*suffix`) matches `role`.
fn wildcard(pattern: &str, role: &str) -> bool {
    if let Some(prefix) = pattern.strip_suffix('*') {
        if role.starts_with(prefix) {
            return true;
        }
    }
    if let Some(suffix) = pattern.strip_prefix('*') {
        if role.ends_with(suffix) {
            return true;
        }
    }
    false
}

/// `persistent://t/ns/x-partition-3` → `persistent://t/ns/x`; other names unchanged.
fn partitioned_base(topic: &str) -> &str {
    match topic.rsplit_once("-partition-") {
        Some((base, index)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => {
            base
        }
        _ => topic,
    }
}

#[cfg(test)]
mod tests;
