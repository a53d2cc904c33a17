//! Build script: compiles `proto/pulsar_api.proto` into Rust with prost-build,
//! using the protoc binary shipped by `protoc-bin-vendored` (no system protoc).
//!
//! Every message-typed field of `BaseCommand` is boxed: the envelope has one
//! optional field per command (~70), and unboxed it weighs over 5 KB, which
//! every decode would zero and move around. Boxed, it is a few hundred bytes
//! plus one allocation for the sub-message actually present.

use std::io;

use prost_types::field_descriptor_proto::Type;

const PROTO: &str = "proto/pulsar_api.proto";
const ENVELOPE: &str = "BaseCommand";

fn main() -> io::Result<()> {
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");

    let protoc = protoc_bin_vendored::protoc_bin_path()
        .map_err(|e| io::Error::other(format!("vendored protoc unavailable: {e}")))?;
    // prost-build looks protoc up through this variable.
    std::env::set_var("PROTOC", protoc);

    let mut config = prost_build::Config::new();
    // Byte fields decode as zero-copy slices of the frame buffer.
    config.bytes(["."]);

    let fds = config.load_fds(&[PROTO], &["proto"])?;
    let envelope = fds
        .file
        .iter()
        .flat_map(|f| {
            let package = f.package().to_owned();
            f.message_type.iter().map(move |m| (package.clone(), m))
        })
        .find(|(_, m)| m.name() == ENVELOPE)
        .ok_or_else(|| io::Error::other(format!("{ENVELOPE} not found in {PROTO}")))?;
    let (package, message) = envelope;
    for field in &message.field {
        if field.r#type() == Type::Message {
            config.boxed(format!(".{package}.{ENVELOPE}.{}", field.name()));
        }
    }

    config.compile_fds(fds)
}
