//! `pto clean`: list pto segments and remove stale ones.

use std::process::ExitCode;

use crate::cli::CleanArgs;

pub fn clean(a: &CleanArgs) -> anyhow::Result<ExitCode> {
    let all = pto_shm::sweep::list();
    if all.is_empty() {
        outln!("no pto segments in /dev/shm");
        return Ok(ExitCode::SUCCESS);
    }
    let (mut removed, mut failed) = (0, 0);
    for s in &all {
        let creator = s.creator.map_or_else(
            || "unknown creator".to_string(),
            |c| format!("creator pid {}", c.pid),
        );
        let state = if s.alive { "live" } else { "stale" };
        let remove = !a.dry_run && (!s.alive || a.all);
        outln!(
            "{:<60} {:>12} bytes  {creator:<20} {state}{}",
            s.name,
            s.bytes,
            if remove { "  removed" } else { "" }
        );
        if remove {
            // Another user's segment cannot be removed: say so and go on.
            match pto_shm::Segment::unlink(&s.name) {
                Ok(()) => removed += 1,
                Err(e) => {
                    pto_shm::eprint_line!("pto clean: cannot remove {}: {e}", s.name);
                    failed += 1;
                }
            }
        }
    }
    if failed > 0 {
        outln!(
            "{} segment(s), {removed} removed, {failed} could not be removed",
            all.len()
        );
    } else {
        outln!("{} segment(s), {removed} removed", all.len());
    }
    Ok(ExitCode::SUCCESS)
}
