//! `cairn nbd ls|info URI`: what an NBD server offers, asked with `NBD_OPT_LIST` and
//! `NBD_OPT_INFO` (no transmission, nothing read or written). An `nbds://` URI (or its
//! `tls-*` keys) negotiates TLS first, as opening the export does, so a server that
//! requires TLS answers; a server that does not offer TLS is an error, never plaintext.

use cairn_nbd::client::{Client, ClientOptions, ExportInfo};
use cairn_nbd::proto::{FLAG_CAN_MULTI_CONN, FLAG_READ_ONLY, REP_ERR_TLS_REQD};
use cairn_nbd::uri::NbdUri;
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::error::{CliError, Result};
use crate::global::Global;

pub const NBD_EXAMPLES: &str = "\
Examples:
  cairn nbd ls nbd://diskhost/                       # every export of the server, sized
  cairn nbd ls 'nbds://diskhost/?tls-psk-file=/etc/cairn/psk&tls-username=alice'
  cairn nbd info nbd+unix:///d0?socket=/run/cairn.sock";

/// `cairn nbd`.
#[derive(Debug, Subcommand)]
pub enum NbdCommand {
    /// List the exports of the server a URI names (its export part is ignored), with
    /// each export's size and flags
    Ls(UriArgs),
    /// Show what the server says about the export a URI names
    Info(UriArgs),
}

#[derive(Debug, Args)]
pub struct UriArgs {
    /// nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH, or the nbds:// forms
    /// (TLS with tls-psk-file= or tls-certificates=)
    #[arg(value_name = "URI")]
    pub uri: String,
}

#[derive(Debug, Serialize)]
struct Line {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    read_only: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    multi_conn: Option<bool>,
    /// Why INFO about a listed export failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Line {
    fn of(info: &ExportInfo, description: Option<String>) -> Line {
        Line {
            name: info.name.clone(),
            description: description.or_else(|| info.description.clone()),
            size: Some(info.size),
            read_only: Some(info.has(FLAG_READ_ONLY)),
            multi_conn: Some(info.has(FLAG_CAN_MULTI_CONN)),
            error: None,
        }
    }
}

fn options(uri: &str) -> Result<(NbdUri, ClientOptions)> {
    let u = NbdUri::parse(uri).map_err(|e| CliError::new(format!("{uri}: {e}")))?;
    let mut o = ClientOptions::from_uri(&u).map_err(|e| CliError::new(format!("{u}: {e}")))?;
    o.timeout = Some(std::time::Duration::from_secs(10));
    Ok((u, o))
}

/// The error in the user's terms: a server that wants TLS is told apart.
fn failed(u: &NbdUri, what: &str, e: cairn_nbd::client::Error) -> CliError {
    if e.option_reply() == Some(REP_ERR_TLS_REQD) {
        return CliError::new(format!(
            "{u}: the server requires TLS and refused {what} in plaintext; use an nbds:// \
             URI with tls-psk-file= or tls-certificates= ({e})"
        ));
    }
    CliError::new(format!("{u}: {what}: {e}"))
}

pub fn run(cmd: NbdCommand, global: &Global) -> Result<()> {
    let lines = match &cmd {
        NbdCommand::Ls(a) => {
            let (u, o) = options(&a.uri)?;
            let list =
                Client::list_exports_with(&o).map_err(|e| failed(&u, "listing the exports", e))?;
            list.into_iter()
                .map(|(name, description)| {
                    let description = Some(description).filter(|d| !d.is_empty());
                    let mut q = o.clone();
                    q.export = name.clone();
                    match Client::query_info_with(&q) {
                        Ok(info) => Line::of(&info, description),
                        Err(e) => Line {
                            name,
                            description,
                            size: None,
                            read_only: None,
                            multi_conn: None,
                            error: Some(e.to_string()),
                        },
                    }
                })
                .collect::<Vec<_>>()
        }
        NbdCommand::Info(a) => {
            let (u, o) = options(&a.uri)?;
            let info = Client::query_info_with(&o)
                .map_err(|e| failed(&u, "asking about the export", e))?;
            vec![Line::of(&info, None)]
        }
    };
    if global.json {
        println!("{}", serde_json::to_string(&lines).expect("serialisable"));
        return Ok(());
    }
    for l in &lines {
        let shown = if l.name.is_empty() {
            "(default)"
        } else {
            &l.name
        };
        match (&l.error, l.size) {
            (Some(e), _) => println!("{shown}\t(INFO refused: {e})"),
            (None, Some(size)) => {
                let mut flags = Vec::new();
                if l.read_only == Some(true) {
                    flags.push("read-only");
                }
                if l.multi_conn == Some(true) {
                    flags.push("multi-conn");
                }
                println!(
                    "{shown}\t{size}\t{}{}",
                    if flags.is_empty() {
                        "-".to_string()
                    } else {
                        flags.join(",")
                    },
                    l.description
                        .as_deref()
                        .map(|d| format!("\t{d}"))
                        .unwrap_or_default()
                );
            }
            (None, None) => println!("{shown}"),
        }
    }
    if lines.is_empty() {
        eprintln!("the server lists no exports");
    }
    Ok(())
}
