//! The controlling terminal: passphrase prompts without echo, typed confirmations, and
//! progress bars on stderr (indicatif's; drawn only when stderr is a terminal).
//!
//! Prompts go to and answers come from `/dev/tty`, not stdin/stdout, so `--json` output
//! and `--key-file -` (stdin) stay clean, and a script without a terminal fails with advice
//! instead of hanging. Passphrases read here live in [`SecretBytes`], zeroed on drop.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;

use cairn_luks::SecretBytes;
use zeroize::Zeroize;

use crate::error::{CliError, Result};

/// A progress bar on stderr for work counted in bytes (a rebuild, a resync). Drawn only
/// when stderr is a terminal: otherwise it writes nothing at all, no escape code or colour,
/// and the caller's own lines are the whole output.
#[derive(Debug)]
pub struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    /// A bar that shows `message` (set again with [`Progress::update`]) before the counts.
    pub fn bytes(message: &str) -> Progress {
        use std::io::IsTerminal;
        let target = if std::io::stderr().is_terminal() {
            indicatif::ProgressDrawTarget::stderr()
        } else {
            indicatif::ProgressDrawTarget::hidden()
        };
        let style = indicatif::ProgressStyle::with_template(
            "{msg}: [{bar:30}] {percent:>3}% {binary_bytes}/{binary_total_bytes} \
             {binary_bytes_per_sec} ETA {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        // Dropped on an early return (an error to print), the bar is cleared too.
        let bar = indicatif::ProgressBar::with_draw_target(Some(0), target)
            .with_style(style)
            .with_finish(indicatif::ProgressFinish::AndClear);
        bar.set_message(message.to_string());
        Progress { bar }
    }

    /// Moves the bar to `done` of `total` bytes, with `message` before it.
    pub fn update(&self, message: &str, done: u64, total: u64) {
        if self.bar.message() != message {
            self.bar.set_message(message.to_string());
        }
        self.bar.set_length(total);
        self.bar.set_position(done.min(total));
    }

    /// Removes the bar (when drawn), leaving the terminal as it was before it.
    pub fn clear(&self) {
        self.bar.finish_and_clear();
    }
}

/// Longest passphrase read from a prompt (cryptsetup's limit is 512 bytes too).
const MAX_PROMPTED: usize = 512;

fn open_tty() -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()
}

/// Whether there is a terminal to ask.
pub fn available() -> bool {
    open_tty().is_some()
}

/// Puts the terminal's echo back when dropped, even if reading fails.
struct EchoOff {
    fd: i32,
    saved: libc::termios,
}

impl EchoOff {
    fn new(fd: i32) -> Option<EchoOff> {
        // SAFETY: termios is plain data; tcgetattr fills it or fails (then it is unused).
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd is an open descriptor owned by the caller for this guard's lifetime.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return None;
        }
        let saved = t;
        t.c_lflag &= !(libc::ECHO | libc::ECHONL);
        t.c_lflag |= libc::ICANON;
        // SAFETY: as above; t is a valid termios derived from the current one.
        if unsafe { libc::tcsetattr(fd, libc::TCSADRAIN, &t) } != 0 {
            return None;
        }
        Some(EchoOff { fd, saved })
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in new() on the same open descriptor.
        unsafe {
            libc::tcsetattr(self.fd, libc::TCSADRAIN, &self.saved);
        }
    }
}

/// Reads one line from the terminal without echo, after printing `prompt`.
fn read_hidden(prompt: &str) -> Result<SecretBytes> {
    let mut tty = open_tty().ok_or_else(no_tty)?;
    let fd = tty.as_raw_fd();
    let _ = write!(tty, "{prompt}");
    let _ = tty.flush();
    let guard = EchoOff::new(fd);
    // Unbuffered, into buffers zeroed after use: no stray copy of the passphrase is left
    // in a reader's buffer.
    let mut line = Vec::with_capacity(MAX_PROMPTED + 2);
    let mut chunk = [0u8; 64];
    let read = loop {
        match tty.read(&mut chunk) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                let room = (MAX_PROMPTED + 1).saturating_sub(line.len());
                line.extend_from_slice(&chunk[..n.min(room)]);
                if chunk[..n].contains(&b'\n') {
                    break Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    chunk.zeroize();
    drop(guard);
    let _ = writeln!(tty);
    if let Err(e) = read {
        line.zeroize();
        return Err(CliError::new(format!("cannot read the passphrase: {e}")));
    }
    if let Some(nl) = line.iter().position(|&b| b == b'\n') {
        line[nl..].zeroize();
        line.truncate(nl);
    }
    if line.len() > MAX_PROMPTED {
        line.zeroize();
        return Err(CliError::new(format!(
            "passphrase longer than {MAX_PROMPTED} bytes; use --key-file for long keys"
        )));
    }
    Ok(SecretBytes::from_vec(line))
}

fn no_tty() -> CliError {
    CliError::new(
        "no terminal to ask for the passphrase; give it with --key-file FILE (or \
         --key-file - for stdin)",
    )
}

/// Asks for a passphrase once.
pub fn passphrase(prompt: &str) -> Result<SecretBytes> {
    let p = read_hidden(prompt)?;
    if p.is_empty() {
        return Err(CliError::new("empty passphrase; nothing was changed"));
    }
    Ok(p)
}

/// Asks for a new passphrase twice; they must match.
pub fn new_passphrase(prompt: &str) -> Result<SecretBytes> {
    let a = passphrase(prompt)?;
    let b = read_hidden("Verify passphrase: ")?;
    if a != b {
        return Err(CliError::new("Passphrases do not match."));
    }
    Ok(a)
}

/// cryptsetup's confirmation: the user must type YES in capitals.
pub fn confirm_yes(warning: &str) -> Result<bool> {
    let mut tty = open_tty().ok_or_else(|| {
        CliError::new(format!(
            "{warning}\nNo terminal to confirm on; add -q (--batch-mode) to go ahead without asking"
        ))
    })?;
    let _ = write!(
        tty,
        "\nWARNING!\n========\n{warning}\n\nAre you sure? (Type 'yes' in capital letters): "
    );
    let _ = tty.flush();
    let mut line = String::new();
    BufReader::new(&tty)
        .read_line(&mut line)
        .map_err(|e| CliError::new(format!("cannot read the answer: {e}")))?;
    Ok(line.trim_end_matches(['\n', '\r']) == "YES")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With stderr not a terminal (as under cargo test or CI), the bar draws nothing.
    #[test]
    fn progress_is_silent_off_a_terminal() {
        use std::io::IsTerminal;
        let p = Progress::bytes("resync of r");
        p.update("resync of r", 5, 10);
        p.update("recovery of r", 20, 10);
        assert_eq!(p.bar.position(), 10);
        assert_eq!(p.bar.is_hidden(), !std::io::stderr().is_terminal());
        p.clear();
    }
}
