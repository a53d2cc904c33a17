//! `magnetar standalone`: broker, storage and metadata in one process (the embedded metadata
//! store, bootstrapped with `public/default`); the server itself is `server.rs`.

use crate::cli::ServerArgs;
use crate::config::{Mode, Settings};

pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    let settings = Settings::load(&args, Mode::Standalone)?;
    crate::server::run(settings, "standalone")
}
