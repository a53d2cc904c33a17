//! A small Avro schema model and the reader/writer resolution check that schema compatibility
//! is built on (Avro specification, "Schema Resolution"). Pure: no I/O.
//!
//! Only what decides compatibility is modelled: primitive types (logical types are their
//! underlying type), records (field names, aliases, whether a default exists), enums, arrays,
//! maps, fixed, unions and references to named types (recursive types included).

use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// A schema definition that is not valid Avro (as far as this model checks).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid Avro schema: {0}")]
pub struct AvroParseError(pub String);

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Record {
        name: String,
        fields: Vec<Field>,
    },
    /// Only the name matters to compatibility (a symbol list must exist to parse).
    Enum {
        name: String,
    },
    Array(Box<Node>),
    Map(Box<Node>),
    Fixed {
        name: String,
        size: u64,
    },
    Union(Vec<Node>),
    /// A reference to a named type, by full name.
    Ref(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Field {
    name: String,
    aliases: Vec<String>,
    node: Node,
    has_default: bool,
}

/// A parsed Avro schema with its named types.
#[derive(Debug, Clone)]
pub struct AvroSchema {
    root: Node,
    named: HashMap<String, Node>,
}

impl AvroSchema {
    /// Parses a JSON-encoded Avro schema definition.
    pub fn parse(definition: &[u8]) -> Result<AvroSchema, AvroParseError> {
        let json: Value = serde_json::from_slice(definition)
            .map_err(|e| AvroParseError(format!("not JSON: {e}")))?;
        let mut named = HashMap::new();
        let root = parse_node(&json, None, &mut named, 0)?;
        Ok(AvroSchema { root, named })
    }

    /// Whether data written with `writer` can be read with `self` as reader schema. The error
    /// says why not.
    pub fn can_read(&self, writer: &AvroSchema) -> Result<(), String> {
        let mut checker = Checker { reader: self, writer, assumed: HashSet::new() };
        checker.check(&self.root, &writer.root, "")
    }
}

const MAX_DEPTH: usize = 64;

fn full_name(name: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() && !name.contains('.') => format!("{ns}.{name}"),
        _ => name.to_string(),
    }
}

fn short_name(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

fn parse_node(
    json: &Value,
    namespace: Option<&str>,
    named: &mut HashMap<String, Node>,
    depth: usize,
) -> Result<Node, AvroParseError> {
    if depth > MAX_DEPTH {
        return Err(AvroParseError("schema nested too deeply".into()));
    }
    match json {
        Value::String(name) => Ok(match primitive(name) {
            Some(node) => node,
            None => {
                let full = full_name(name, namespace);
                if named.contains_key(&full) {
                    Node::Ref(full)
                } else if named.contains_key(name.as_str()) {
                    Node::Ref(name.clone())
                } else {
                    return Err(AvroParseError(format!("unknown type {name:?}")));
                }
            }
        }),
        Value::Array(branches) => {
            let nodes = branches
                .iter()
                .map(|b| parse_node(b, namespace, named, depth + 1))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Node::Union(nodes))
        }
        Value::Object(object) => {
            let kind = object.get("type").ok_or_else(|| AvroParseError("no \"type\"".into()))?;
            let Value::String(kind) = kind else {
                // {"type": {...}} or {"type": [...]}: the nested schema itself.
                return parse_node(kind, namespace, named, depth + 1);
            };
            if let Some(node) = primitive(kind) {
                return Ok(node); // possibly with a logicalType: same encoding
            }
            let name_of = |object: &serde_json::Map<String, Value>| -> Result<(String, Option<String>), AvroParseError> {
                let name = object
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| AvroParseError(format!("{kind} without a name")))?;
                let ns = object.get("namespace").and_then(Value::as_str).or(namespace);
                let full = full_name(name, ns);
                let inner_ns = full.rsplit_once('.').map(|(ns, _)| ns.to_string());
                Ok((full, inner_ns))
            };
            match kind.as_str() {
                "record" | "error" => {
                    let (full, inner_ns) = name_of(object)?;
                    // Registered before the fields so that they may refer to the record.
                    named.insert(full.clone(), Node::Record { name: full.clone(), fields: vec![] });
                    let fields_json = object
                        .get("fields")
                        .and_then(Value::as_array)
                        .ok_or_else(|| AvroParseError(format!("record {full} without fields")))?;
                    let mut fields = Vec::with_capacity(fields_json.len());
                    for field in fields_json {
                        let name = field
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or_else(|| AvroParseError("field without a name".into()))?;
                        let ty = field
                            .get("type")
                            .ok_or_else(|| AvroParseError(format!("field {name} without type")))?;
                        let node = parse_node(ty, inner_ns.as_deref(), named, depth + 1)?;
                        let aliases = field
                            .get("aliases")
                            .and_then(Value::as_array)
                            .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
                            .unwrap_or_default();
                        fields.push(Field {
                            name: name.to_string(),
                            aliases,
                            node,
                            has_default: field.get("default").is_some(),
                        });
                    }
                    let node = Node::Record { name: full.clone(), fields };
                    named.insert(full, node.clone());
                    Ok(node)
                }
                "enum" => {
                    let (full, _) = name_of(object)?;
                    object
                        .get("symbols")
                        .and_then(Value::as_array)
                        .ok_or_else(|| AvroParseError(format!("enum {full} without symbols")))?;
                    let node = Node::Enum { name: full.clone() };
                    named.insert(full, node.clone());
                    Ok(node)
                }
                "fixed" => {
                    let (full, _) = name_of(object)?;
                    let size = object
                        .get("size")
                        .and_then(Value::as_u64)
                        .ok_or_else(|| AvroParseError(format!("fixed {full} without size")))?;
                    let node = Node::Fixed { name: full.clone(), size };
                    named.insert(full, node.clone());
                    Ok(node)
                }
                "array" => {
                    let items = object
                        .get("items")
                        .ok_or_else(|| AvroParseError("array without items".into()))?;
                    Ok(Node::Array(Box::new(parse_node(items, namespace, named, depth + 1)?)))
                }
                "map" => {
                    let values = object
                        .get("values")
                        .ok_or_else(|| AvroParseError("map without values".into()))?;
                    Ok(Node::Map(Box::new(parse_node(values, namespace, named, depth + 1)?)))
                }
                other => parse_node(&Value::String(other.to_string()), namespace, named, depth + 1),
            }
        }
        other => Err(AvroParseError(format!("unexpected {other}"))),
    }
}

fn primitive(name: &str) -> Option<Node> {
    Some(match name {
        "null" => Node::Null,
        "boolean" => Node::Boolean,
        "int" => Node::Int,
        "long" => Node::Long,
        "float" => Node::Float,
        "double" => Node::Double,
        "bytes" => Node::Bytes,
        "string" => Node::String,
        _ => return None,
    })
}

struct Checker<'a> {
    reader: &'a AvroSchema,
    writer: &'a AvroSchema,
    /// Pairs of named types under check: meeting one again (a recursive type) is assumed fine.
    assumed: HashSet<(String, String)>,
}

impl Checker<'_> {
    fn resolve<'n>(schema: &'n AvroSchema, node: &'n Node) -> &'n Node {
        match node {
            Node::Ref(name) => schema.named.get(name).unwrap_or(node),
            _ => node,
        }
    }

    fn check(&mut self, reader: &Node, writer: &Node, path: &str) -> Result<(), String> {
        let reader = Self::resolve(self.reader, reader);
        let writer = Self::resolve(self.writer, writer);
        if let Node::Union(branches) = writer {
            // Every branch the writer may have used must be readable.
            for branch in branches {
                self.check(reader, branch, path)?;
            }
            return Ok(());
        }
        if let Node::Union(branches) = reader {
            for branch in branches {
                // A failed attempt must not leave assumptions behind.
                let saved = self.assumed.clone();
                if self.check(branch, writer, path).is_ok() {
                    return Ok(());
                }
                self.assumed = saved;
            }
            return Err(format!("{}: no union branch reads {}", at(path), describe(writer)));
        }
        use Node::*;
        match (reader, writer) {
            (Null, Null)
            | (Boolean, Boolean)
            | (Int, Int)
            | (Long, Long)
            | (Float, Float)
            | (Double, Double)
            | (Bytes, Bytes)
            | (String, String) => Ok(()),
            // Promotions allowed by the specification.
            (Long, Int) | (Float, Int | Long) | (Double, Int | Long | Float) => Ok(()),
            (String, Bytes) | (Bytes, String) => Ok(()),
            // Records match by their fields alone: Avro's resolver (which Pulsar's check runs)
            // does not compare record names, so a renamed record (the Python client names it
            // after its class) still reads and is read.
            (Record { name: rn, fields: rf }, Record { name: wn, fields: wf }) => {
                if !self.assumed.insert((rn.clone(), wn.clone())) {
                    return Ok(());
                }
                for field in rf {
                    let written =
                        wf.iter().find(|w| w.name == field.name || field.aliases.contains(&w.name));
                    let field_path = format!("{path}/{}", field.name);
                    match written {
                        Some(w) => self.check(&field.node, &w.node, &field_path)?,
                        None if field.has_default => {}
                        None => {
                            return Err(format!(
                                "{}: field {} is missing in the writer's schema and has no default",
                                at(&field_path),
                                field.name
                            ))
                        }
                    }
                }
                Ok(())
            }
            // Enums must share their name; their symbols are never a refusal (Avro's resolver
            // turns an unknown symbol into a read-time error, not a schema incompatibility).
            (Enum { name: rn, .. }, Enum { name: wn, .. }) => {
                if short_name(rn) != short_name(wn) {
                    return Err(format!("{}: enum {rn} cannot read enum {wn}", at(path)));
                }
                Ok(())
            }
            (Array(r), Array(w)) => self.check(r, w, &format!("{path}[]")),
            (Map(r), Map(w)) => self.check(r, w, &format!("{path}{{}}")),
            (Fixed { name: rn, size: rs }, Fixed { name: wn, size: ws }) => {
                if short_name(rn) == short_name(wn) && rs == ws {
                    Ok(())
                } else {
                    Err(format!("{}: fixed {rn}({rs}) cannot read fixed {wn}({ws})", at(path)))
                }
            }
            (r, w) => Err(format!("{}: {} cannot read {}", at(path), describe(r), describe(w))),
        }
    }
}

fn at(path: &str) -> &str {
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

fn describe(node: &Node) -> String {
    match node {
        Node::Null => "null".into(),
        Node::Boolean => "boolean".into(),
        Node::Int => "int".into(),
        Node::Long => "long".into(),
        Node::Float => "float".into(),
        Node::Double => "double".into(),
        Node::Bytes => "bytes".into(),
        Node::String => "string".into(),
        Node::Record { name, .. } => format!("record {name}"),
        Node::Enum { name, .. } => format!("enum {name}"),
        Node::Array(_) => "array".into(),
        Node::Map(_) => "map".into(),
        Node::Fixed { name, .. } => format!("fixed {name}"),
        Node::Union(_) => "union".into(),
        Node::Ref(name) => name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(json: &str) -> AvroSchema {
        AvroSchema::parse(json.as_bytes()).expect("valid schema")
    }

    const V1: &str = r#"{"type":"record","name":"User","fields":[
        {"name":"name","type":["null","string"]},{"name":"age","type":["null","int"]}]}"#;

    #[test]
    fn identical_schemas_read_each_other() {
        assert!(schema(V1).can_read(&schema(V1)).is_ok());
    }

    #[test]
    fn added_field_needs_a_default_to_read_old_data() {
        let with_default = schema(
            r#"{"type":"record","name":"User","fields":[
            {"name":"name","type":["null","string"]},{"name":"age","type":["null","int"]},
            {"name":"email","type":["null","string"],"default":null}]}"#,
        );
        let without_default = schema(
            r#"{"type":"record","name":"User","fields":[
            {"name":"name","type":["null","string"]},{"name":"age","type":["null","int"]},
            {"name":"email","type":["null","string"]}]}"#,
        );
        let v1 = schema(V1);
        assert!(with_default.can_read(&v1).is_ok());
        let err = without_default.can_read(&v1).unwrap_err();
        assert!(err.contains("email"), "{err}");
        // The old reader ignores the new field either way.
        assert!(v1.can_read(&without_default).is_ok());
    }

    #[test]
    fn type_changes_follow_promotion_rules() {
        let long_age = schema(
            r#"{"type":"record","name":"User","fields":[
            {"name":"name","type":["null","string"]},{"name":"age","type":["null","long"]}]}"#,
        );
        let v1 = schema(V1);
        assert!(long_age.can_read(&v1).is_ok(), "int promotes to long");
        let why = v1.can_read(&long_age).unwrap_err();
        assert_eq!(why, "/age: no union branch reads long", "long does not narrow to int");
        let string_age = schema(
            r#"{"type":"record","name":"User","fields":[
            {"name":"name","type":"string"},{"name":"age","type":"string"}]}"#,
        );
        let why = string_age.can_read(&v1).unwrap_err();
        assert!(why.contains("string cannot read"), "{why}");
    }

    #[test]
    fn record_names_are_not_compared() {
        // Pulsar's python test_schema_evolve: records User1 and User2 with the same fields.
        let renamed = schema(&V1.replace("\"User\"", "\"UserV2\""));
        assert!(renamed.can_read(&schema(V1)).is_ok());
        assert!(schema(V1).can_read(&renamed).is_ok());
        // A nested record renamed inside a union, too (test_avro_required_default).
        let nested = |name: &str| {
            schema(&format!(
                r#"{{"type":"record","name":"Outer","fields":[{{"name":"j","type":["null",
                {{"type":"record","name":"{name}","fields":[{{"name":"x","type":["null","int"]}}]}}]}}]}}"#
            ))
        };
        assert!(nested("MySubRecord").can_read(&nested("Sub")).is_ok());
        // What still refuses is the fields: a field the writer lacks needs a default.
        let other =
            schema(r#"{"type":"record","name":"Other","fields":[{"name":"id","type":"long"}]}"#);
        let why = other.can_read(&schema(V1)).unwrap_err().to_string();
        assert!(
            why.contains("field id is missing in the writer's schema and has no default"),
            "{why}"
        );
    }

    #[test]
    fn enums_match_by_name_and_their_symbols_never_refuse() {
        let ab = schema(r#"{"type":"enum","name":"E","symbols":["A","B"]}"#);
        let abc = schema(r#"{"type":"enum","name":"E","symbols":["A","B","C"]}"#);
        let other = schema(r#"{"type":"enum","name":"F","symbols":["A","B"]}"#);
        assert!(abc.can_read(&ab).is_ok());
        assert!(ab.can_read(&abc).is_ok(), "Avro leaves unknown symbols to read time");
        let why = other.can_read(&ab).unwrap_err().to_string();
        assert!(why.contains("enum F cannot read enum E"), "{why}");
    }

    #[test]
    fn recursive_types_terminate() {
        let list = r#"{"type":"record","name":"Node","fields":[
            {"name":"value","type":"int"},{"name":"next","type":["null","Node"]}]}"#;
        assert!(schema(list).can_read(&schema(list)).is_ok());
    }

    #[test]
    fn nested_and_logical_types() {
        let a = schema(
            r#"{"type":"record","name":"R","namespace":"x","fields":[
            {"name":"tags","type":{"type":"array","items":"string"}},
            {"name":"attrs","type":{"type":"map","values":"long"}},
            {"name":"day","type":{"type":"int","logicalType":"date"}}]}"#,
        );
        assert!(a.can_read(&a).is_ok());
        let b = schema(
            r#"{"type":"record","name":"R","namespace":"x","fields":[
            {"name":"tags","type":{"type":"array","items":"int"}},
            {"name":"attrs","type":{"type":"map","values":"long"}},
            {"name":"day","type":"int"}]}"#,
        );
        let err = a.can_read(&b).unwrap_err();
        assert!(err.contains("tags"), "{err}");
    }

    #[test]
    fn rejects_invalid_definitions() {
        for bad in [&b"not json"[..], b"{}", b"\"Unknown\"", b"{\"type\":\"record\"}", b"42"] {
            assert!(AvroSchema::parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
