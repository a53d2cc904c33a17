//! The configuration reference (`docs/src/reference/configuration.md`), generated from the
//! config structs: each key's meaning is its field's doc comment, its type the field's type,
//! its default the example file's value (which `the_example_config_lists_every_knob_with_its_
//! default` proves equal to the struct's `Default`). The test fails when the page, the structs
//! and `magnetar.example.toml` disagree; `MAGNETAR_WRITE_REFERENCE=1 cargo test -p magnetar
//! config_reference` rewrites the page.

/// The sections of the file: `(table, struct, its source)`; `""` is the top level.
const SECTIONS: &[(&str, &str, &str)] = &[
    ("", "ServerConfig", include_str!("config.rs")),
    ("broker", "BrokerConfig", include_str!("../../broker/src/config.rs")),
    ("storage", "StorageSection", include_str!("config.rs")),
    ("ledgers", "LedgersSection", include_str!("config.rs")),
    ("metadata", "MetadataSection", include_str!("config.rs")),
    ("load_manager", "LoadManagerSection", include_str!("config.rs")),
    ("coordination", "CoordinationSection", include_str!("config.rs")),
    ("log", "LogSection", include_str!("config.rs")),
    ("tls", "TlsConfig", include_str!("../../security/src/tls.rs")),
    (
        "authentication",
        "AuthenticationConfig",
        include_str!("../../security/src/authentication/mod.rs"),
    ),
    ("authorization", "AuthorizationConfig", include_str!("../../security/src/authorization.rs")),
];

const EXAMPLE: &str = include_str!("../../../magnetar.example.toml");
const PAGE: &str = "docs/src/reference/configuration.md";

/// A field of a config struct as its source declares it.
#[derive(Debug)]
struct Field {
    name: String,
    rust_type: String,
    doc: String,
    /// `#[serde(skip)]`: not read from the file.
    skipped: bool,
}

/// The fields of `pub struct <name> { ... }` in `source`, in order.
fn fields(source: &str, name: &str) -> Vec<Field> {
    let start = format!("pub struct {name} {{");
    let body = source
        .split_once(&start)
        .unwrap_or_else(|| panic!("struct {name} not found"))
        .1
        .split("\n}")
        .next()
        .unwrap_or_default();
    let mut out = Vec::new();
    let (mut doc, mut skipped) = (Vec::<String>::new(), false);
    for line in body.lines().map(str::trim) {
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim().to_string());
        } else if line.starts_with("#[serde(") && line.contains("skip") {
            skipped = true;
        } else if let Some(declaration) = line.strip_prefix("pub ") {
            let (field, rust_type) = declaration.split_once(':').expect("a field");
            out.push(Field {
                name: field.trim().to_string(),
                rust_type: rust_type.trim().trim_end_matches(',').to_string(),
                doc: doc.join(" "),
                skipped,
            });
            (doc, skipped) = (Vec::new(), false);
        } else if !line.starts_with("#[") && !line.starts_with("//") && !line.is_empty() {
            // A field's declaration continues (a long type): nothing to take.
        }
    }
    out
}

/// The comment above each key of the example file, by `section.key` (`.key` at the top level):
/// a comment block covers the keys right below it, up to a blank line.
fn example_comments() -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    let (mut section, mut block) = (String::new(), Vec::<String>::new());
    let mut block_used = false;
    for line in EXAMPLE.lines().map(str::trim) {
        if line.is_empty() {
            (block, block_used) = (Vec::new(), false);
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            (block, block_used) = (Vec::new(), false);
        } else if let Some(comment) = line.strip_prefix('#') {
            if block_used {
                (block, block_used) = (Vec::new(), false);
            }
            block.push(comment.trim().to_string());
        } else if let Some((key, _)) = line.split_once('=') {
            out.insert(format!("{section}.{}", key.trim()), block.join(" "));
            block_used = true;
        }
    }
    out
}

/// A key's meaning: its field's doc comment, else the example's comment.
fn meaning(
    field: &Field,
    section: &str,
    comments: &std::collections::HashMap<String, String>,
) -> String {
    if !field.doc.is_empty() {
        return field.doc.clone();
    }
    comments.get(&format!("{section}.{}", field.name)).cloned().unwrap_or_default()
}

fn type_name(rust_type: &str) -> String {
    let optional = rust_type.strip_prefix("Option<").and_then(|t| t.strip_suffix('>'));
    let base = optional.unwrap_or(rust_type);
    let name = match base {
        "u8" | "u16" | "u32" | "u64" | "usize" => "integer ≥ 0".to_string(),
        "i32" | "i64" => "integer".to_string(),
        "f64" => "number".to_string(),
        "bool" => "boolean".to_string(),
        "String" => "string".to_string(),
        "PathBuf" | "std::path::PathBuf" => "path".to_string(),
        "Vec<String>" => "list of strings".to_string(),
        other => format!("`{other}`"),
    };
    if optional.is_some() {
        format!("{name}, optional")
    } else {
        name
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The reference page.
fn generate() -> String {
    let example: toml::Value = toml::from_str(EXAMPLE).expect("the example parses");
    let comments = example_comments();
    let mut page = String::from(
        "# Configuration reference\n\n\
         <!-- generated from the config structs by crates/magnetar/src/config_reference.rs; \
         do not edit: MAGNETAR_WRITE_REFERENCE=1 cargo test -p magnetar config_reference -->\n\n\
         `magnetar standalone`, `magnetar broker` and `magnetar storage` read one TOML file \
         (`--config FILE`; command-line flags override it). Every key is optional; a key the \
         binary does not know is an error, and the whole file is validated before any data is \
         opened. `magnetar.example.toml` in the repository lists every key with its default \
         and the same comments. Types: an integer, boolean, string or list as in TOML; a size \
         or a duration is an integer in the unit its name says.\n",
    );
    for (section, name, source) in SECTIONS {
        let table = if section.is_empty() {
            example.as_table()
        } else {
            example.get(section).and_then(toml::Value::as_table)
        };
        let table = table.unwrap_or_else(|| panic!("the example has no [{section}]"));
        let title =
            if section.is_empty() { "Top level".to_string() } else { format!("`[{section}]`") };
        page.push_str(&format!(
            "\n## {title}\n\n| key | type | default | meaning |\n|---|---|---|---|\n"
        ));
        for field in fields(source, name) {
            if field.skipped
                || (section.is_empty() && table.get(&field.name).is_some_and(toml::Value::is_table))
            {
                continue;
            }
            let default = match table.get(&field.name) {
                Some(value) => format!("`{value}`"),
                None => "unset".to_string(),
            };
            page.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                field.name,
                type_name(&field.rust_type),
                cell(&default),
                cell(&meaning(&field, section, &comments))
            ));
        }
    }
    page
}

#[test]
fn the_configuration_reference_is_generated_from_the_config_structs() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let path = format!("{root}/{PAGE}");
    let page = generate();
    if std::env::var_os("MAGNETAR_WRITE_REFERENCE").is_some() {
        std::fs::write(&path, &page).expect("writes the page");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == page,
        "{PAGE} is not what the config structs say: regenerate it with \
         MAGNETAR_WRITE_REFERENCE=1 cargo test -p magnetar config_reference"
    );
}

#[test]
fn every_key_of_the_structs_is_in_the_example_and_the_other_way_round() {
    let example: toml::Value = toml::from_str(EXAMPLE).expect("the example parses");
    // Read from elsewhere than the file's own key (see `config.rs`): the cluster name comes
    // from `cluster`, TLS and authentication settings from their own sections.
    let not_in_file = ["broker.authenticator"];
    for (section, name, source) in SECTIONS {
        let table = if section.is_empty() {
            example.as_table()
        } else {
            example.get(section).and_then(toml::Value::as_table)
        }
        .expect("the section is in the example");
        let fields = fields(source, name);
        assert!(!fields.is_empty(), "{name} has fields");
        for field in &fields {
            let key = format!("{section}.{}", field.name);
            let nested =
                section.is_empty() && table.get(&field.name).is_some_and(toml::Value::is_table);
            if field.skipped || nested || not_in_file.contains(&key.as_str()) {
                continue;
            }
            assert!(
                table.contains_key(&field.name) || field.rust_type.starts_with("Option<"),
                "{key} is a config field but not in magnetar.example.toml"
            );
            let comments = example_comments();
            assert!(
                !meaning(field, section, &comments).is_empty(),
                "{key} has neither a doc comment nor a comment in the example"
            );
        }
        for key in table.keys() {
            let known = fields.iter().any(|f| &f.name == key && !f.skipped);
            let nested_section = section.is_empty() && table[key].is_table();
            assert!(
                known || nested_section,
                "{section}.{key} is in the example but no config field"
            );
        }
    }
}
