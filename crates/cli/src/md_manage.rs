//! `cairn md fail|remove|add|replace|check|repair`: changes to an array that a running
//! `cairn serve` holds, sent through its control socket (mdadm --manage and md's
//! sync_action, for an array served by cairn).
//!
//! ```text
//!   cairn md add ARRAY DEV ── POST /v1/actions {"action":"md-add",...} ──> daemon.rs
//!   cairn md check ARRAY --wait ── POST md-scrub, then GET /v1/arrays/ARRAY until done
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use crate::control;
use crate::control::ControlArgs;
use crate::error::{CliError, Result};
use crate::global::Global;
use cairn_stack::size::format_size;

pub const FAIL_LONG: &str = "\
Mark MEMBER of the served md ARRAY faulty, as `mdadm --fail` does: it takes no more I/O, \
the other members' superblocks record it (events + 1), and the array goes on degraded. \
If a spare is present it takes the role over and is rebuilt at once.

Refused when the array could not serve all its data without the member (the last copy of \
a RAID1, a second member of a RAID5). ARRAY is the array's name (with or without the \
host: part), its UUID, or an export it is under; MEMBER is the path it was opened with \
or its file name.";

pub const REMOVE_LONG: &str = "\
Take a faulty member or a spare out of the served md ARRAY (mdadm --remove). An active \
member must be failed first. The role stays empty until a spare is added.";

pub const ADD_LONG: &str = "\
Add DEVICE to the served md ARRAY (mdadm --add). A former member of this array goes back \
into its old role and is rebuilt there; anything else becomes a hot spare, which takes \
over a role that is down (now or when a member fails later) and is rebuilt in the \
background: watch it with `cairn status`.

DEVICE must be at least as large as the other members. A device that holds another md \
array, a filesystem, LUKS or LVM is refused unless --force.";

pub const REPLACE_LONG: &str = "\
Replace MEMBER of the served md ARRAY without losing redundancy (mdadm --replace): its \
contents are copied onto the new device while it keeps serving; then the new device \
takes its role and MEMBER is marked faulty (remove it afterwards). With --with DEVICE \
that device is used (added as a spare first); without, the first spare.";

pub const CHECK_LONG: &str = "\
Start a scrub of the served md ARRAY in the background (md's `check`): every stripe's \
parity (RAID4/5/6) or every copy (RAID1/10) is read and compared with the data, at md's \
speed limits so clients keep priority. Mismatches are counted in sectors, as md's \
mismatch_cnt, and listed by region (stripe, array and member offsets); on RAID6 the \
member holding a bad block is named from the P/Q syndromes. Nothing is written.

With --wait the command follows the progress and prints the result; it exits 1 when \
mismatches or read errors were found (for cron jobs). See docs/md-scrub.md.";

pub const REPAIR_LONG: &str = "\
Like `cairn md check`, but mismatches are rewritten (md's `repair`): parity from the data \
on RAID4/5, the block the syndromes name on RAID6 (parity from the data when they name \
none), the first copy over the others on RAID1/10.";

const EXAMPLES: &str = "\
Examples:
  cairn md fail md0 d2.img            # mark d2.img faulty
  cairn md add md0 /srv/spare.img     # a hot spare; it takes the failed role over
  cairn md remove md0 d2.img
  cairn md replace md0 d1.img --with /srv/new.img
  cairn md check md0 --wait           # scrub and print the mismatches
  cairn md repair md0
  cairn status                        # the rebuild's progress";

/// `cairn md fail` / `cairn md remove`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct MdMemberArgs {
    /// The array: its name, UUID, or an export it is under
    #[arg(value_name = "ARRAY")]
    pub array: String,

    /// The member: the path it was opened with, or its file name
    #[arg(value_name = "MEMBER")]
    pub member: String,

    #[command(flatten)]
    pub control: ControlArgs,
}

/// `cairn md add`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct MdAddArgs {
    /// The array: its name, UUID, or an export it is under
    #[arg(value_name = "ARRAY")]
    pub array: String,

    /// The file or block device to add
    #[arg(value_name = "DEVICE")]
    pub device: PathBuf,

    /// Overwrite a device that holds another array, a filesystem, LUKS or LVM
    #[arg(short, long)]
    pub force: bool,

    /// Follow the rebuild this starts (if any) until it ends, with its progress
    #[arg(short, long)]
    pub wait: bool,

    #[command(flatten)]
    pub control: ControlArgs,
}

/// `cairn md replace`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct MdReplaceArgs {
    /// The array: its name, UUID, or an export it is under
    #[arg(value_name = "ARRAY")]
    pub array: String,

    /// The member to replace
    #[arg(value_name = "MEMBER")]
    pub member: String,

    /// The new device [default: the first spare]
    #[arg(long, value_name = "DEVICE")]
    pub with: Option<PathBuf>,

    /// Overwrite a --with device that holds another array, a filesystem, LUKS or LVM
    #[arg(short, long)]
    pub force: bool,

    /// Follow the copy until the new device has taken the role, with its progress
    #[arg(short, long)]
    pub wait: bool,

    #[command(flatten)]
    pub control: ControlArgs,
}

/// `cairn md check` / `cairn md repair`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct MdScrubArgs {
    /// The array: its name, UUID, or an export it is under
    #[arg(value_name = "ARRAY")]
    pub array: String,

    /// Follow the scrub until it ends and print the result
    #[arg(short, long)]
    pub wait: bool,

    #[command(flatten)]
    pub control: ControlArgs,
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if cairn_stack::leaf::is_remote(p) {
        return Ok(p.to_path_buf());
    }
    std::path::absolute(p)
        .map_err(|e| CliError::new(format!("cannot make {} absolute: {e}", p.display())))
}

/// The daemon serving `array` (see [`control::resolve_for`]); asked once per command.
fn daemon_for(control: &ControlArgs, array: &str) -> Result<PathBuf> {
    control::resolve_for(control.control.as_deref(), control::Wants::Array(array))
}

/// Sends one action to the daemon on `path`; prints its message (or the JSON answer)
/// unless `quiet`.
fn act(path: &Path, body: &Value, global: &Global, quiet: bool) -> Result<Value> {
    let (status, v) = control::request(path, "POST", "/v1/actions", Some(body))?;
    if !(200..300).contains(&status) {
        return Err(CliError::new(v["error"].as_str().map_or_else(
            || format!("the daemon answered {status}: {v}"),
            str::to_string,
        )));
    }
    match v["message"].as_str() {
        _ if quiet => {}
        _ if global.json => println!("{v}"),
        Some(m) => println!("{m}"),
        None => {}
    }
    Ok(v)
}

pub fn fail(a: &MdMemberArgs, global: &Global) -> Result<()> {
    let body = json!({"action": "md-fail", "array": a.array, "member": a.member});
    act(&daemon_for(&a.control, &a.array)?, &body, global, false).map(drop)
}

pub fn remove(a: &MdMemberArgs, global: &Global) -> Result<()> {
    let body = json!({"action": "md-remove", "array": a.array, "member": a.member});
    act(&daemon_for(&a.control, &a.array)?, &body, global, false).map(drop)
}

pub fn add(a: &MdAddArgs, global: &Global) -> Result<()> {
    let body = json!({
        "action": "md-add",
        "array": a.array,
        "path": absolute(&a.device)?,
        "force": a.force,
    });
    act_and_wait(&a.control, &a.array, &body, global, a.wait)
}

pub fn replace(a: &MdReplaceArgs, global: &Global) -> Result<()> {
    let with = a.with.as_deref().map(absolute).transpose()?;
    let body = json!({
        "action": "md-replace",
        "array": a.array,
        "member": a.member,
        "with": with,
        "force": a.force,
    });
    act_and_wait(&a.control, &a.array, &body, global, a.wait)
}

/// The array's newest background job number (0 before any).
fn job_id(path: &Path, route: &str) -> Result<u64> {
    Ok(control::get_ok(path, route)?["background"]["id"]
        .as_u64()
        .unwrap_or(0))
}

/// Sends `body`; with `wait`, follows the background jobs it starts until they end.
fn act_and_wait(
    control: &ControlArgs,
    array: &str,
    body: &Value,
    global: &Global,
    wait: bool,
) -> Result<()> {
    let path = daemon_for(control, array)?;
    let route = format!("/v1/arrays/{array}");
    let before = if wait { job_id(&path, &route)? } else { 0 };
    act(&path, body, global, false)?;
    if wait {
        wait_jobs(&path, &route, array, before)?;
    }
    Ok(())
}

/// Follows the jobs numbered after `before` (a rebuild, then perhaps the next the array
/// queues) until none runs and the array is not recovering, with a progress bar on
/// stderr when it is a terminal. A job that fails or is stopped is an error. When the
/// action started nothing (a spare on a healthy array), returns after a second.
fn wait_jobs(path: &Path, route: &str, array: &str, before: u64) -> Result<()> {
    let bar = crate::tty::Progress::bytes(array);
    let started = std::time::Instant::now();
    let mut followed = false;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let v = control::get_ok(path, route)?;
        let bg = &v["background"];
        let action = bg["action"].as_str().unwrap_or("background work");
        let state = bg["state"].as_str().unwrap_or("");
        let recovering = v["detail"]["state_text"]
            .as_str()
            .is_some_and(|t| t.contains("recovering"));
        let new = bg["id"].as_u64().unwrap_or(0) > before;
        if new && (state.starts_with("failed") || state == "stopped") {
            return Err(CliError::new(format!("{action} of {array}: {state}")));
        }
        if new && state == "running" {
            followed = true;
            let done = bg["done_bytes"].as_u64().unwrap_or(0);
            let total = bg["total_bytes"].as_u64().unwrap_or(0).max(1);
            bar.update(&format!("{action} of {array}"), done, total);
            continue;
        }
        // Nothing of ours runs: done once the array is not waiting for another job.
        if !recovering && (new || started.elapsed() >= Duration::from_secs(1)) {
            break;
        }
    }
    bar.clear();
    if followed {
        eprintln!("{array}: done");
    }
    Ok(())
}

pub fn scrub(a: &MdScrubArgs, repair: bool, global: &Global) -> Result<()> {
    let body = json!({"action": "md-scrub", "array": a.array, "repair": repair});
    let path = daemon_for(&a.control, &a.array)?;
    scrub_through(&path, &body, &a.array, repair, a.wait, global)
}

/// Starts the scrub `body` asks the daemon on `path` for; with `wait`, follows
/// `/v1/arrays/ARRAY` until it ends, prints the report, and fails when it found
/// mismatches or read errors. Also `cairn lvm lvchange --syncaction` (ARRAY `VG/LV`).
pub(crate) fn scrub_through(
    path: &Path,
    body: &Value,
    array: &str,
    repair: bool,
    wait: bool,
    global: &Global,
) -> Result<()> {
    act(path, body, global, wait)?;
    if !wait {
        return Ok(());
    }
    let route = format!("/v1/arrays/{array}");
    let action = if repair { "repair" } else { "check" };
    let bar = crate::tty::Progress::bytes(array);
    let report = loop {
        std::thread::sleep(Duration::from_millis(200));
        let v = control::get_ok(path, &route)?;
        let bg = &v["background"];
        let mine = bg["action"].as_str() == Some(action);
        let state = bg["state"].as_str().unwrap_or("");
        if mine && state == "running" {
            let done = bg["done_bytes"].as_u64().unwrap_or(0);
            let total = bg["total_bytes"].as_u64().unwrap_or(0).max(1);
            bar.update(&format!("{action} of {array}"), done, total);
        }
        if mine && state.starts_with("failed") {
            return Err(CliError::new(format!("{action} of {}: {state}", array)));
        }
        if mine && state != "running" && v["scrub"]["complete"] == json!(true) {
            bar.clear();
            break v["scrub"].clone();
        }
        if mine && state == "stopped" {
            return Err(CliError::new(format!(
                "{action} of {} stopped before the end (the server is stopping)",
                array
            )));
        }
    };
    if global.json {
        println!("{report}");
    } else {
        print!("{}", scrub_text(array, action, &report));
    }
    let mism = report["mismatch_sectors"].as_u64().unwrap_or(0);
    let errs = report["read_errors"].as_u64().unwrap_or(0);
    if mism > 0 || errs > 0 {
        return Err(CliError::new(format!(
            "{action} of {}: {mism} mismatched sectors, {errs} read errors{}",
            array,
            if repair { " (repaired)" } else { "" }
        )));
    }
    Ok(())
}

/// The result of a scrub, for people.
fn scrub_text(array: &str, action: &str, r: &Value) -> String {
    let n = |k: &str| r[k].as_u64().unwrap_or(0);
    let mut s = format!(
        "{action} of {array}: {} checked, {} mismatched sectors, {} read errors\n",
        format_size(n("bytes_checked")),
        n("mismatch_sectors"),
        n("read_errors")
    );
    let regions = r["regions"].as_array().cloned().unwrap_or_default();
    if !regions.is_empty() {
        s.push_str("  finding         stripe    array offset    member offset  length  blamed\n");
    }
    for m in &regions {
        let stripe = m["stripe"]
            .as_u64()
            .map_or_else(|| "-".to_string(), |x| x.to_string());
        let blamed = m["blamed"]
            .as_u64()
            .map_or_else(|| "-".to_string(), |x| format!("role {x}"));
        s.push_str(&format!(
            "  {:<14} {:>7} {:>15} {:>16} {:>7}  {blamed}{}\n",
            m["finding"].as_str().unwrap_or("?"),
            stripe,
            m["array_offset"].as_u64().unwrap_or(0),
            m["member_offset"].as_u64().unwrap_or(0),
            format_size(m["len"].as_u64().unwrap_or(0)),
            if m["repaired"] == json!(true) {
                "  repaired"
            } else {
                ""
            }
        ));
    }
    if n("regions_omitted") > 0 {
        s.push_str(&format!(
            "  ... and {} more regions\n",
            n("regions_omitted")
        ));
    }
    s
}
