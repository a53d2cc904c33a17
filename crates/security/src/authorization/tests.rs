//! Table tests of the decision core.

use super::*;

const TOPIC: &str = "persistent://acme/ns/orders";

fn config(enabled: bool) -> AuthorizationConfig {
    AuthorizationConfig {
        enabled,
        super_user_roles: vec!["root".to_string()],
        allow_wildcards_matching: false,
        proxy_roles: vec![],
    }
}

/// A namespace: `producer` may produce, `consumer` may consume, `both` both, `ops` has
/// `functions`; `topic-writer` may produce on `orders` only; subscription `locked` is for
/// `consumer` only.
fn namespace(mode: &str) -> NamespaceAuth {
    let json = format!(
        r#"{{
        "auth_policies": {{
            "namespace_auth": {{
                "producer": ["produce"], "consumer": ["consume"], "both": ["produce","consume"],
                "ops": ["functions", "packages"], "svc-*": ["produce"], "*-reader": ["consume"]
            }},
            "destination_auth": {{
                "persistent://acme/ns/orders": {{"topic-writer": ["produce"], "topic-reader": ["consume"]}}
            }},
            "subscription_auth_roles": {{"locked": ["consumer"], "open": []}}
        }},
        "subscription_auth_mode": "{mode}",
        "retention_policies": {{"retentionTimeInMinutes": 1}}
    }}"#
    );
    NamespaceAuth::from_policies_json(json.as_bytes()).expect("valid document")
}

fn admins() -> Vec<String> {
    vec!["acme-admin".to_string()]
}

fn facts<'a>(role: Option<&'a str>, admins: &'a [String], ns: &'a NamespaceAuth) -> Facts<'a> {
    Facts { role, tenant_admin_roles: Some(admins), namespace: Some(ns) }
}

#[test]
fn produce_consume_lookup_table() {
    let ns = namespace("None");
    let admins = admins();
    // (role, produce, consume (no subscription), lookup)
    let table: &[(Option<&str>, bool, bool, bool)] = &[
        (Some("root"), true, true, true),
        (Some("acme-admin"), true, true, true),
        (Some("producer"), true, false, true),
        (Some("consumer"), false, true, true),
        (Some("both"), true, true, true),
        (Some("ops"), false, false, false),
        (Some("topic-writer"), true, false, true),
        (Some("topic-reader"), false, true, true),
        (Some("stranger"), false, false, false),
        // wildcards are off by default: these names match nothing
        (Some("svc-billing"), false, false, false),
        (Some("audit-reader"), false, false, false),
        (None, false, false, false),
    ];
    let on = config(true);
    let off = config(false);
    for (role, produce, consume, lookup) in table {
        let f = facts(*role, &admins, &ns);
        assert_eq!(on.can_produce(&f, TOPIC).is_ok(), *produce, "produce {role:?}");
        assert_eq!(on.can_consume(&f, TOPIC, None).is_ok(), *consume, "consume {role:?}");
        assert_eq!(on.can_lookup(&f, TOPIC).is_ok(), *lookup, "lookup {role:?}");
        // disabled: everything goes, with or without a role
        assert!(off.can_produce(&f, TOPIC).is_ok());
        assert!(off.can_consume(&f, TOPIC, Some("locked")).is_ok());
        assert!(off.allow_super_user(&f).is_ok());
    }
}

#[test]
fn topic_permissions_do_not_leak_to_other_topics_but_cover_partitions() {
    let ns = namespace("None");
    let admins = admins();
    let on = config(true);
    let f = facts(Some("topic-writer"), &admins, &ns);
    assert!(on.can_produce(&f, "persistent://acme/ns/orders-partition-2").is_ok());
    assert!(on.can_produce(&f, "persistent://acme/ns/payments").is_err());
    assert!(on.can_produce(&f, "persistent://acme/ns/orders-partition-x").is_err());
}

#[test]
fn subscription_permissions_table() {
    let admins = admins();
    let on = config(true);
    // (mode, role, subscription, allowed)
    let table: &[(&str, &str, Option<&str>, bool)] = &[
        ("None", "consumer", Some("locked"), true),
        ("None", "both", Some("locked"), false),
        ("None", "both", Some("open"), true),
        ("None", "both", Some("anything"), true),
        ("None", "both", Some(""), true),
        ("None", "producer", Some("anything"), false),
        ("None", "acme-admin", Some("locked"), true),
        ("None", "root", Some("locked"), true),
        ("Prefix", "both", Some("both-sub"), true),
        ("Prefix", "both", Some("other-sub"), false),
        ("Prefix", "consumer", Some("locked"), false),
        ("Prefix", "both", None, true),
        ("Prefix", "root", Some("x"), true),
    ];
    for (mode, role, sub, allowed) in table {
        let ns = namespace(mode);
        let f = facts(Some(role), &admins, &ns);
        let got = on.can_consume(&f, TOPIC, *sub);
        assert_eq!(got.is_ok(), *allowed, "{mode} {role} {sub:?}: {got:?}");
        let op = on.allow_topic_operation(&f, TOPIC, TopicOperation::Subscribe, *sub);
        assert_eq!(op.is_ok(), *allowed, "subscribe {mode} {role} {sub:?}");
    }
    let ns = namespace("None");
    let denied = on.can_consume(&facts(Some("both"), &admins, &ns), TOPIC, Some("locked"));
    assert_eq!(
        denied.unwrap_err().0,
        "both is not authorized to access subscription locked on topic persistent://acme/ns/orders"
    );
}

#[test]
fn wildcards_only_when_enabled() {
    let ns = namespace("None");
    let admins = vec!["team-*".to_string()];
    let mut on = config(true);
    let f = facts(Some("svc-billing"), &admins, &ns);
    assert!(on.can_produce(&f, TOPIC).is_err());
    on.allow_wildcards_matching = true;
    assert!(on.can_produce(&f, TOPIC).is_ok());
    assert!(on.can_consume(&f, TOPIC, None).is_err());
    let reader = facts(Some("audit-reader"), &admins, &ns);
    assert!(on.can_consume(&reader, TOPIC, None).is_ok());
    assert!(on.can_produce(&reader, TOPIC).is_err());
    let team = facts(Some("team-a"), &admins, &ns);
    assert!(on.allow_tenant_admin(&team).is_ok());
    on.allow_wildcards_matching = false;
    assert!(on.allow_tenant_admin(&team).is_err());
}

#[test]
fn tenant_and_super_user_operations_table() {
    let ns = namespace("None");
    let admins = admins();
    let on = config(true);
    // (role, super-user operations, tenant admin operations)
    let table: &[(Option<&str>, bool, bool)] = &[
        (Some("root"), true, true),
        (Some("acme-admin"), false, true),
        (Some("both"), false, false),
        (Some("stranger"), false, false),
        (None, false, false),
    ];
    for (role, superuser, tenant) in table {
        let f = facts(*role, &admins, &ns);
        assert_eq!(on.allow_super_user(&f).is_ok(), *superuser, "{role:?}");
        assert_eq!(
            on.allow_tenant_operation(&f, TenantOperation::CreateNamespace).is_ok(),
            *tenant,
            "{role:?}"
        );
        assert_eq!(
            on.allow_namespace_policy_operation(&f, PolicyOperation::Write).is_ok(),
            *tenant
        );
        assert_eq!(on.allow_topic_policy_operation(&f, PolicyOperation::Read).is_ok(), *tenant);
        for op in
            [TopicOperation::Terminate, TopicOperation::Unload, TopicOperation::GrantPermission]
        {
            assert_eq!(on.allow_topic_operation(&f, TOPIC, op, None).is_ok(), *tenant);
        }
    }
    // a tenant that does not exist has no admins
    let missing = Facts { role: Some("acme-admin"), tenant_admin_roles: None, namespace: None };
    assert!(on.allow_tenant_admin(&missing).is_err());
    // an admin of another tenant is nobody here
    let other = vec!["other-admin".to_string()];
    assert!(on.allow_tenant_admin(&facts(Some("acme-admin"), &other, &ns)).is_err());
    assert!(on.can_produce(&facts(Some("acme-admin"), &other, &ns), TOPIC).is_err());
}

#[test]
fn namespace_operations_table() {
    use NamespaceOperation as N;
    let ns = namespace("None");
    let admins = admins();
    let on = config(true);
    // (role, operation, allowed)
    let table: &[(&str, NamespaceOperation, bool)] = &[
        ("producer", N::GetTopics, true),
        ("consumer", N::GetTopics, true),
        ("ops", N::GetTopics, false),
        ("stranger", N::GetTopics, false),
        ("topic-writer", N::GetTopics, false), // topic-level only: not a namespace permission
        ("consumer", N::Unsubscribe, true),
        ("producer", N::ClearBacklog, false),
        ("ops", N::Functions, true),
        ("ops", N::Packages, true),
        ("ops", N::Sinks, false),
        ("both", N::CreateTopic, false),
        ("both", N::GrantPermission, false),
        ("both", N::GetPermission, false),
        ("acme-admin", N::CreateTopic, true),
        ("acme-admin", N::GrantPermission, true),
        ("root", N::DeleteTopic, true),
    ];
    for (role, op, allowed) in table {
        let f = facts(Some(role), &admins, &ns);
        assert_eq!(on.allow_namespace_operation(&f, *op).is_ok(), *allowed, "{role} {op:?}");
    }
    let none = Facts { role: Some("producer"), tenant_admin_roles: Some(&admins), namespace: None };
    assert!(on.allow_namespace_operation(&none, N::GetTopics).is_err());
}

#[test]
fn documents_parse_leniently_but_not_wrongly() {
    let empty = NamespaceAuth::from_policies_json(b"{}").expect("empty document");
    assert_eq!(empty, NamespaceAuth::default());
    let unknown_action = NamespaceAuth::from_policies_json(
        br#"{"auth_policies":{"namespace_auth":{"r":["fly","produce"]}}}"#,
    )
    .expect("unknown actions are kept");
    let admins = admins();
    let on = config(true);
    assert!(on.can_produce(&facts(Some("r"), &admins, &unknown_action), TOPIC).is_ok());
    assert!(
        NamespaceAuth::from_policies_json(br#"{"auth_policies":{"namespace_auth":[]}}"#).is_err()
    );
    assert!(NamespaceAuth::from_policies_json(b"not json").is_err());
    assert_eq!(AuthAction::parse("consume"), Some(AuthAction::Consume));
    assert_eq!(AuthAction::parse("Consume"), None);
}

#[test]
fn no_role_is_refused_with_a_reason() {
    let ns = namespace("None");
    let admins = admins();
    let denied = config(true).can_produce(&facts(None, &admins, &ns), TOPIC).unwrap_err();
    assert_eq!(denied.0, "Authentication required");
}

#[test]
fn config_parses_with_defaults() {
    #[derive(Deserialize)]
    struct File {
        authorization: AuthorizationConfig,
    }
    let file: File = toml_like();
    assert!(file.authorization.enabled);
    assert_eq!(file.authorization.super_user_roles, vec!["admin".to_string()]);
    assert!(!file.authorization.allow_wildcards_matching);
    fn toml_like() -> File {
        serde_json::from_str(r#"{"authorization":{"enabled":true,"super_user_roles":["admin"]}}"#)
            .expect("parses")
    }
    let unknown: Result<AuthorizationConfig, _> = serde_json::from_str(r#"{"superusers":[]}"#);
    assert!(unknown.is_err());
}
