//! Authorization of the admin API: one table from route to the operation Pulsar checks, and a
//! middleware (a route layer, so it sees the matched route) that decides it with the security
//! crate's decision core over the tenant and namespace documents. A refusal is 403
//! `{"reason": …}`. The caller's role is the request extension [`Principal`] (inserted by the
//! authentication middleware; absent while authentication is off, which with authorization on
//! is refused).
//!
//! The table ([`classify`]) follows Pulsar's admin resources: clusters, tenants and brokers
//! are super-user business (cluster reads: any role); namespace and topic policies, topic
//! creation / deletion, permissions, unload and terminate are tenant-admin business; topic
//! stats and metadata need lookup (produce or consume); subscription operations need consume
//! (with the subscription's own permission); listing a namespace's topics needs produce or
//! consume at namespace level. Health, readiness, version, `/metrics` and the console's static
//! files are public. A route not in the table is super-user only.

use crate::error::AdminError;
use crate::AdminState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use magnetar_model::keys;
use magnetar_model::names::{decode_path_segment, decode_topic_name, NamespaceName, TopicName};
use magnetar_security::authorization::{
    Facts, NamespaceAuth, NamespaceOperation, PolicyOperation, TopicOperation,
};
use magnetar_security::Principal;
use serde::Deserialize;

/// What a route requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Required {
    /// Anyone, authenticated or not.
    Public,
    /// Any authenticated role.
    Authenticated,
    SuperUser,
    /// An admin of the route's tenant (tenant operations, namespace and topic policies).
    TenantAdmin(PolicyOperation),
    Namespace(NamespaceOperation),
    Topic(TopicOperation),
}

/// The operation `route` (an axum route pattern, `{name}` placeholders, domain literal)
/// requires for `method`.
pub(crate) fn classify(method: &Method, route: &str) -> Required {
    use NamespaceOperation as N;
    use Required as R;
    use TopicOperation as T;
    let read = if method == Method::GET { PolicyOperation::Read } else { PolicyOperation::Write };
    let (get, put, delete) =
        (method == Method::GET, method == Method::PUT, method == Method::DELETE);
    match route {
        "/admin/v2/brokers/health" | "/admin/v2/brokers/ready" | "/admin/v2/brokers/version" => {
            return R::Public
        }
        "/metrics"
        | "/metrics/"
        | "/"
        | "/console"
        | "/console/"
        | "/console/app.js"
        | "/console/app.css"
        | "/console/favicon.svg" => return R::Public,
        "/admin/v2/tenants" => return R::SuperUser,
        "/admin/v2/tenants/{tenant}" if get => return R::TenantAdmin(read),
        "/admin/v2/tenants/{tenant}" => return R::SuperUser,
        "/admin/v2/namespaces/{tenant}" => return R::TenantAdmin(read),
        _ => {}
    }
    if route.starts_with("/admin/v2/clusters/{cluster}/namespaceIsolationPolicies") {
        return R::SuperUser; // as Pulsar: which brokers serve whom is the operator's
    }
    if route.starts_with("/admin/v2/clusters") {
        return if get { R::Authenticated } else { R::SuperUser };
    }
    if route.starts_with("/admin/v2/brokers") || route.starts_with("/admin/v2/broker-stats") {
        return R::SuperUser;
    }
    if route.starts_with("/lookup/v2/topic/") {
        return R::Topic(T::Lookup);
    }
    if let Some(rest) = route.strip_prefix("/admin/v2/schemas/{tenant}/{namespace}/{topic}/") {
        return match rest {
            "compatibility" | "version" => R::Topic(T::GetMetadata),
            _ if get => R::Topic(T::GetMetadata),
            _ => R::TenantAdmin(read),
        };
    }
    if let Some(rest) = route.strip_prefix("/admin/v2/namespaces/{tenant}/{namespace}") {
        return match rest {
            "" => R::TenantAdmin(read),
            "/topics" => R::Namespace(N::GetTopics),
            "/bundles" => R::Namespace(N::GetBundle),
            _ if rest.starts_with("/permissions") => {
                if get {
                    R::Namespace(N::GetPermission)
                } else if delete {
                    R::Namespace(N::RevokePermission)
                } else {
                    R::Namespace(N::GrantPermission)
                }
            }
            _ => R::TenantAdmin(read),
        };
    }
    let topic_level = ["/admin/v2/persistent/", "/admin/v2/non-persistent/"]
        .iter()
        .find_map(|prefix| route.strip_prefix(prefix))
        .and_then(|rest| rest.strip_prefix("{tenant}/{namespace}"));
    let Some(rest) = topic_level else { return R::SuperUser };
    let Some(rest) = rest.strip_prefix("/{topic}") else {
        // `/admin/v2/{domain}/{t}/{ns}` and `…/partitioned`: the namespace's topics.
        return R::Namespace(N::GetTopics);
    };
    let sub = rest.strip_prefix("/subscription/{subscription}");
    match rest {
        "" if put => R::Namespace(N::CreateTopic),
        "" if delete => R::Namespace(N::DeleteTopic),
        "/partitions" if get => R::Topic(T::GetMetadata),
        "/partitions" if put => R::Namespace(N::CreateTopic),
        "/partitions" if delete => R::Namespace(N::DeleteTopic),
        "/partitions" => R::Topic(T::UpdateMetadata),
        "/stats" | "/internalStats" | "/partitioned-stats" | "/partitioned-internalStats" => {
            R::Topic(T::GetStats)
        }
        "/subscriptions" => R::Topic(T::GetSubscriptions),
        "/examinemessage" | "/lastMessageId" | "/messageid/{timestamp}" => {
            R::Topic(T::PeekMessages)
        }
        _ if rest.starts_with("/ledger/") => R::Topic(T::PeekMessages),
        "/unload" => R::Topic(T::Unload),
        "/compaction" => R::Topic(T::Compact),
        "/terminate" | "/terminate/partitions" => R::Topic(T::Terminate),
        "/properties" if get => R::Topic(T::GetMetadata),
        "/properties" if delete => R::Topic(T::DeleteMetadata),
        "/properties" => R::Topic(T::UpdateMetadata),
        "/permissions" => R::Topic(T::GetPermission),
        "/permissions/{role}" if delete => R::Topic(T::RevokePermission),
        "/permissions/{role}" => R::Topic(T::GrantPermission),
        "/all_subscription/expireMessages/{seconds}" => R::Topic(T::ExpireMessages),
        _ => match sub {
            Some("") if put => R::Topic(T::Subscribe),
            Some("") => R::Topic(T::Unsubscribe),
            Some(s) if s.starts_with("/skip") => R::Topic(T::Skip),
            Some(s) if s.starts_with("/resetcursor") => R::Topic(T::ResetCursor),
            Some(s) if s.starts_with("/position/") => R::Topic(T::PeekMessages),
            Some(s) if s.starts_with("/expireMessages") => R::Topic(T::ExpireMessages),
            Some(_) => R::Topic(T::Consume),
            // Topic policies.
            None => R::TenantAdmin(read),
        },
    }
}

/// The path parameters of `route` in `path`: (name, raw value) pairs.
fn params<'a>(route: &'a str, path: &'a str) -> Vec<(&'a str, &'a str)> {
    route
        .split('/')
        .zip(path.split('/'))
        .filter_map(|(pattern, value)| {
            let name = pattern.strip_prefix('{')?.strip_suffix('}')?;
            Some((name, value))
        })
        .collect()
}

/// What the route names: tenant, namespace, topic, subscription.
#[derive(Default)]
struct Target {
    tenant: Option<String>,
    namespace: Option<NamespaceName>,
    topic: Option<TopicName>,
    subscription: Option<String>,
}

fn target(route: &str, path: &str) -> Target {
    let params = params(route, path);
    let param = |name: &str| params.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let tenant = param("tenant").and_then(decode_path_segment);
    let namespace = match (&tenant, param("namespace").and_then(decode_path_segment)) {
        (Some(t), Some(ns)) => NamespaceName::new(t, &ns).ok(),
        _ => None,
    };
    let domain = if route.contains("/non-persistent/") {
        magnetar_model::names::TopicDomain::NonPersistent
    } else {
        magnetar_model::names::TopicDomain::Persistent
    };
    let topic = match (&namespace, param("topic").and_then(decode_topic_name)) {
        (Some(ns), Some(local)) => TopicName::new(domain, ns.clone(), &local).ok(),
        _ => None,
    };
    let subscription = param("subscription").and_then(decode_topic_name);
    Target { tenant, namespace, topic, subscription }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TenantDoc {
    #[serde(rename = "adminRoles")]
    admin_roles: Vec<String>,
}

/// Decides `required` for `principal` on `target`, reading the documents it needs.
async fn decide(
    state: &AdminState,
    principal: Option<&Principal>,
    required: Required,
    target: &Target,
) -> Result<(), AdminError> {
    let config = &state.authorization;
    let role = principal.map(|p| p.role.as_str());
    let bare = Facts { role, ..Facts::default() };
    let forbidden =
        |denied: magnetar_security::authorization::Denied| AdminError::Forbidden(denied.0);
    match required {
        Required::Public => return Ok(()),
        Required::SuperUser => return config.allow_super_user(&bare).map_err(forbidden),
        Required::Authenticated => {
            return match role {
                Some(_) => Ok(()),
                None => Err(AdminError::Forbidden("Authentication required".to_string())),
            }
        }
        _ => {}
    }
    // Super-users (and a disabled authorization) need no document.
    if config.allow_super_user(&bare).is_ok() {
        return Ok(());
    }
    let admins = match &target.tenant {
        Some(tenant) => match state.store.get(&keys::tenant(tenant)).await? {
            Some(found) => Some(
                serde_json::from_slice::<TenantDoc>(&found.value)
                    .map_err(|e| AdminError::Internal(format!("Corrupt tenant {tenant}: {e}")))?
                    .admin_roles,
            ),
            None => None,
        },
        None => None,
    };
    // Pulsar's `validateTenantAdminAccess`: a missing tenant is 404 before any permission.
    if target.tenant.is_some() && admins.is_none() && role.is_some() {
        return Err(AdminError::NotFound("Tenant does not exist".to_string()));
    }
    let namespace = match &target.namespace {
        Some(ns) => match state.store.get(&keys::namespace_key(ns)).await? {
            Some(found) => Some(NamespaceAuth::from_policies_json(&found.value).map_err(|e| {
                AdminError::Internal(format!("Corrupt policies of namespace {ns}: {e}"))
            })?),
            None => None,
        },
        None => None,
    };
    let facts =
        Facts { role, tenant_admin_roles: admins.as_deref(), namespace: namespace.as_ref() };
    let decided = match required {
        Required::TenantAdmin(op) => config.allow_namespace_policy_operation(&facts, op),
        Required::Namespace(op) => config.allow_namespace_operation(&facts, op),
        Required::Topic(op) => match &target.topic {
            Some(topic) => config.allow_topic_operation(
                &facts,
                &topic.to_string(),
                op,
                target.subscription.as_deref(),
            ),
            // An unparsable topic: let the handler answer its 412.
            None => config.allow_tenant_admin(&facts).or(Ok(())),
        },
        Required::Public | Required::Authenticated | Required::SuperUser => Ok(()),
    };
    decided.map_err(forbidden)
}

/// The middleware: 403 `{"reason": …}` unless the caller may use the matched route.
pub(crate) async fn authorize(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    if !state.authorization.enabled {
        return next.run(request).await;
    }
    let route = request.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string());
    let Some(route) = route else { return next.run(request).await };
    let required = classify(request.method(), &route);
    let target = target(&route, request.uri().path());
    let principal = request.extensions().get::<Principal>();
    match decide(&state, principal, required, &target).await {
        Ok(()) => next.run(request).await,
        Err(error) => {
            tracing::info!(method = %request.method(), path = %request.uri().path(),
                role = principal.map(|p| p.role.as_str()).unwrap_or("-"), reason = %error,
                "admin request refused");
            error.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_map_to_pulsars_operations() {
        use NamespaceOperation as N;
        use PolicyOperation::{Read, Write};
        use Required as R;
        use TopicOperation as T;
        let t = "/admin/v2/persistent/{tenant}/{namespace}/{topic}";
        let table: Vec<(Method, String, Required)> = vec![
            (Method::GET, "/admin/v2/brokers/ready".into(), R::Public),
            (Method::GET, "/metrics".into(), R::Public),
            (Method::GET, "/admin/v2/brokers".into(), R::SuperUser),
            (Method::GET, "/admin/v2/brokers/{cluster}".into(), R::SuperUser),
            (Method::GET, "/admin/v2/clusters".into(), R::Authenticated),
            (Method::GET, "/admin/v2/tenants".into(), R::SuperUser),
            (Method::PUT, "/admin/v2/tenants/{tenant}".into(), R::SuperUser),
            (Method::DELETE, "/admin/v2/tenants/{tenant}".into(), R::SuperUser),
            (Method::GET, "/admin/v2/tenants/{tenant}".into(), R::TenantAdmin(Read)),
            (Method::GET, "/admin/v2/namespaces/{tenant}".into(), R::TenantAdmin(Read)),
            (
                Method::PUT,
                "/admin/v2/namespaces/{tenant}/{namespace}".into(),
                R::TenantAdmin(Write),
            ),
            (
                Method::GET,
                "/admin/v2/namespaces/{tenant}/{namespace}/topics".into(),
                R::Namespace(N::GetTopics),
            ),
            (
                Method::POST,
                "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}".into(),
                R::Namespace(N::GrantPermission),
            ),
            (
                Method::DELETE,
                "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{subscription}/{role}"
                    .into(),
                R::Namespace(N::RevokePermission),
            ),
            (
                Method::POST,
                "/admin/v2/namespaces/{tenant}/{namespace}/retention".into(),
                R::TenantAdmin(Write),
            ),
            (
                Method::GET,
                "/admin/v2/persistent/{tenant}/{namespace}".into(),
                R::Namespace(N::GetTopics),
            ),
            (Method::PUT, t.into(), R::Namespace(N::CreateTopic)),
            (Method::DELETE, t.into(), R::Namespace(N::DeleteTopic)),
            (Method::GET, format!("{t}/stats"), R::Topic(T::GetStats)),
            (Method::GET, format!("{t}/subscriptions"), R::Topic(T::GetSubscriptions)),
            (Method::PUT, format!("{t}/subscription/{{subscription}}"), R::Topic(T::Subscribe)),
            (
                Method::POST,
                format!("{t}/subscription/{{subscription}}/skip_all"),
                R::Topic(T::Skip),
            ),
            (
                Method::GET,
                format!("{t}/subscription/{{subscription}}/position/{{n}}"),
                R::Topic(T::PeekMessages),
            ),
            (Method::PUT, format!("{t}/unload"), R::Topic(T::Unload)),
            (Method::POST, format!("{t}/terminate"), R::Topic(T::Terminate)),
            (Method::GET, format!("{t}/permissions"), R::Topic(T::GetPermission)),
            (Method::POST, format!("{t}/permissions/{{role}}"), R::Topic(T::GrantPermission)),
            (Method::POST, format!("{t}/retention"), R::TenantAdmin(Write)),
            (Method::GET, format!("{t}/retention"), R::TenantAdmin(Read)),
            (
                Method::GET,
                "/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}".into(),
                R::Topic(T::Lookup),
            ),
            (
                Method::GET,
                "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema".into(),
                R::Topic(T::GetMetadata),
            ),
            (
                Method::POST,
                "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema".into(),
                R::TenantAdmin(Write),
            ),
            (
                Method::POST,
                "/admin/v2/schemas/{tenant}/{namespace}/{topic}/version".into(),
                R::Topic(T::GetMetadata),
            ),
            (Method::GET, "/console/api/history".into(), R::SuperUser),
            (Method::GET, "/something/new".into(), R::SuperUser),
        ];
        for (method, route, required) in table {
            assert_eq!(classify(&method, &route), required, "{method} {route}");
        }
    }

    #[test]
    fn targets_are_read_from_the_path() {
        let route =
            "/admin/v2/non-persistent/{tenant}/{namespace}/{topic}/subscription/{subscription}";
        let t = target(route, "/admin/v2/non-persistent/acme/ns/my%20topic/subscription/sub+1");
        assert_eq!(t.tenant.as_deref(), Some("acme"));
        assert_eq!(t.namespace.map(|n| n.to_string()).as_deref(), Some("acme/ns"));
        assert_eq!(
            t.topic.map(|n| n.to_string()).as_deref(),
            Some("non-persistent://acme/ns/my topic")
        );
        assert_eq!(t.subscription.as_deref(), Some("sub 1"));
    }
}
