//! The CPU time processes have used, for benchmarks that report CPU per operation.

use std::time::Duration;

/// The user + system CPU time processes `pids` have used so far, summed over
/// all their threads (`/proc/PID/stat`); `None` if one cannot be read (gone,
/// or not Linux).
pub fn cpu_time(pids: &[u32]) -> Option<Duration> {
    let ticks_per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let mut ticks = 0u64;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command name, which is in parentheses and may
        // contain spaces: state is the first, utime and stime the 12th and 13th.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        for f in fields.get(11..13)? {
            ticks += f.parse::<u64>().ok()?;
        }
    }
    Some(Duration::from_secs_f64(ticks as f64 / ticks_per_s as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_cpu_time_grows_with_work() {
        let me = [std::process::id()];
        let before = cpu_time(&me).expect("readable");
        // Spin until the clock ticks over (10 ms at the usual 100 Hz).
        let mut x = 0u64;
        while cpu_time(&me).expect("readable") == before {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        }
        assert!(cpu_time(&me).unwrap() > before);
        assert_eq!(cpu_time(&[u32::MAX]), None, "no such process");
    }
}
