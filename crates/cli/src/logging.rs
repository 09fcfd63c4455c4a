//! Log output on stderr, through `tracing`.
//!
//! Default: warnings from every crate plus the command's own `info` lines, printed plainly as
//! `cairn: ...` so they read like the rest of the command's output. `-v` shows `info` from
//! every crate, `-vv` `debug` with timestamps and targets, `-vvv` `trace`. `RUST_LOG`, when
//! set, replaces the filter entirely.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Call once, before anything logs.
pub fn init(verbose: u8) {
    let default = match verbose {
        0 => "warn,cairn_cli=info",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
            eprintln!("cairn: warning: ignoring RUST_LOG={v:?}: {e}");
            EnvFilter::new(default)
        }),
        _ => EnvFilter::new(default),
    };
    // Colour codes only for a terminal: a log file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A log line that cannot be written (stderr on a pipe whose reader is gone) is
    // dropped: the subscriber's own "cannot write" report would go through eprintln! and
    // panic, aborting cairn in the middle of a clean stop.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    // try_init: a second call (tests) keeps the first subscriber instead of panicking.
    let _ = if verbose >= 2 {
        builder.with_target(true).with_thread_names(true).try_init()
    } else {
        builder.event_format(Plain).try_init()
    };
}

/// `cairn: message` for info and below, `cairn: warning: message` / `cairn: error: message`.
#[derive(Debug)]
struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = *event.metadata().level();
        let label = if level == Level::ERROR {
            "error: "
        } else if level == Level::WARN {
            "warning: "
        } else {
            ""
        };
        write!(writer, "cairn: {label}")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
