//! Logging for the long-running commands (`agent`, `serve`): under
//! systemd's journal, each line carries its priority as a `<N>` prefix
//! (sd-daemon(3)), so that `journalctl -p warning` shows the warnings and
//! errors and a failed start is an error; elsewhere the usual format.
//! Without the prefixes every line of a unit was priority 6 (info).

use std::fmt;
use std::os::unix::fs::MetadataExt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{DefaultFields, Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Whether standard error is the journal's stream: systemd sets
/// `JOURNAL_STREAM` to its device and inode (`DEV:INODE`), and a program
/// whose standard error was redirected elsewhere since must not prefix.
pub fn on_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else { return false };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else { return false };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// The syslog priority of a level.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// The prefix of a fatal line (`keyfence: …` before exiting): `<3>` on
/// the journal, else nothing.
pub fn fatal_prefix() -> &'static str {
    if on_journal() {
        "<3>"
    } else {
        ""
    }
}

/// A line for the journal: `<N>`, the target and the fields; the journal
/// adds the time and the unit itself.
struct JournalFormat(Format<tracing_subscriber::fmt::format::Compact, ()>);

impl<S, N> FormatEvent<S, N> for JournalFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Installs the log at `level` on standard error, with priorities when
/// that is the journal.
pub fn init(level: Level) {
    let builder = tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::stderr);
    if on_journal() {
        let format = Format::default().compact().without_time().with_ansi(false);
        builder.fmt_fields(DefaultFields::new()).event_format(JournalFormat(format)).init();
    } else {
        builder.init();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn levels_are_syslog_priorities() {
        use tracing::Level;
        assert_eq!([Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG].map(|l| super::priority(&l)), [3, 4, 6, 7]);
    }
}
