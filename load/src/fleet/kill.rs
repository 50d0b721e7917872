//! A replica SIGKILLed and started again with the same arguments on the
//! same ports, as the kubelet restarts a killed container in its pod, while
//! its slot is followed out of the balancer and back.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Fleet, Member, LB_UP_TIMEOUT, READY_TIMEOUT};
use crate::haproxy::{self, Haproxy};
use crate::replica::{Ended, Spec};
use crate::report::MarkKind;

/// How long a SIGKILLed process may take to be reaped: at once, unless the
/// kernel is stuck; the bound keeps the harness from hanging on it.
const KILL_EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the balancer's view of a killed replica's slot is read, from
/// the kill until it is back.
const STATUS_POLL: Duration = Duration::from_millis(25);

/// A replica's public and admin addresses, which a restart takes back.
pub type Ports = (SocketAddr, SocketAddr);

/// One kill and the restart after it.
#[derive(Clone, Debug)]
pub struct Restart {
    /// The replica (`r2`), whatever its process.
    pub replica: String,
    /// Its balancer slot.
    pub slot: usize,
    /// The process killed.
    pub pid: i32,
    /// How long that process had run.
    pub uptime: Duration,
    /// When it got SIGKILL.
    pub killed_at: Instant,
    /// How it ended (SIGKILL, unless the kernel did not let it go).
    pub ended: Ended,
    /// From the kill to the restarted process's first 200 on `/readyz`.
    pub ready_after: Duration,
    /// The restart got the killed process's ports back; if not (another
    /// socket took one meanwhile) it got new ones, and its slot points there.
    pub same_ports: bool,
    /// From the kill until the balancer's checks took the slot out, if
    /// they did before the restart was ready.
    pub lb_out_after: Option<Duration>,
    /// From the kill until the restart was ready and its slot UP.
    pub lb_in_after: Duration,
}

impl Fleet {
    /// SIGKILLs the `index`th serving replica's process, reaps it, and
    /// starts it again from `spec_for` its ports (or, if they are taken,
    /// from `spec_for(None)`: free ones) while following its slot in the
    /// balancer: out (if its checks fail before the restart is ready) and
    /// back UP. Marks the kill, the slot out, the restart ready and the
    /// slot back in.
    ///
    /// # Errors
    /// If there is no such replica, it cannot be signalled, the restart
    /// fails, or its slot is not back in time.
    pub async fn kill_and_restart(
        &mut self,
        index: usize,
        spec_for: impl Fn(Option<Ports>) -> Spec,
    ) -> anyhow::Result<Restart> {
        let mut member = self.members.remove(index).context("no such replica")?;
        let restart = self.kill_and_follow(&mut member, spec_for).await;
        self.members.insert(index, member);
        let restart = restart?;
        let (at, name) = (restart.killed_at, restart.replica.as_str());
        self.mark(at, MarkKind::Sigkill, name);
        if let Some(after) = restart.lb_out_after {
            self.mark(at + after, MarkKind::LbOut, name);
        }
        self.mark(at + restart.ready_after, MarkKind::Ready, name);
        self.mark(at + restart.lb_in_after, MarkKind::LbIn, name);
        Ok(restart)
    }

    async fn kill_and_follow(
        &self,
        member: &mut Member,
        spec_for: impl Fn(Option<Ports>) -> Spec,
    ) -> anyhow::Result<Restart> {
        let (pid, uptime) = (member.process.pid(), member.process.started.elapsed());
        let killed_at = Instant::now();
        member.process.signal(Signal::SIGKILL)?;
        let ended = member.process.wait_exit(killed_at, KILL_EXIT_TIMEOUT).await;
        let (ready_tx, ready_rx) = watch::channel(false);
        let follow = follow_slot(&self.lb, member.slot, killed_at, ready_rx);
        let restart = async {
            let restarted = self.restart(member, &spec_for).await;
            if restarted.is_ok() {
                let _ = ready_tx.send(true);
            }
            drop(ready_tx);
            restarted.map(|same_ports| (same_ports, killed_at.elapsed()))
        };
        let (followed, restarted) = tokio::join!(follow, restart);
        let (same_ports, ready_after) = restarted?;
        let (lb_out_after, lb_in_after) = followed?;
        Ok(Restart {
            replica: member.name.clone(),
            slot: member.slot,
            pid,
            uptime,
            killed_at,
            ended,
            ready_after,
            same_ports,
            lb_out_after,
            lb_in_after,
        })
    }

    /// Starts `member` again with the same arguments on its ports; if they
    /// are taken, on new ones, and points its slot there. Returns whether
    /// the ports were its own.
    async fn restart(
        &self,
        member: &mut Member,
        spec_for: &impl Fn(Option<Ports>) -> Spec,
    ) -> anyhow::Result<bool> {
        member.starts += 1;
        let admin = member
            .admin
            .context("a restart takes back its admin port")?;
        let ports = (member.process.addr, admin);
        let name = Member::process_name(&member.name, member.starts);
        let (process, admin, same_ports) = match self.spawn(&name, &spec_for(Some(ports))).await {
            Ok((process, admin, _)) => (process, admin, true),
            Err(error) => {
                eprintln!(
                    "load: warning: {name} did not start on its ports ({error:#}); starting it on new ones"
                );
                member.starts += 1;
                let name = Member::process_name(&member.name, member.starts);
                let (process, admin, _) = self.spawn(&name, &spec_for(None)).await?;
                self.enable(member.slot, process.addr, admin).await?;
                (process, admin, false)
            }
        };
        member.admin = admin;
        member.process = process;
        Ok(same_ports)
    }
}

/// Reads `slot`'s state until the restart is ready (`ready` turns true) and
/// the slot is UP in every backend; returns when it first went out of any
/// backend (if it did) and when it was back, from `since`.
///
/// # Errors
/// If the restart failed (`ready` dropped while false), the runtime API
/// fails, or the slot is not back within the restart's and the balancer's
/// bounds.
async fn follow_slot(
    lb: &Haproxy,
    slot: usize,
    since: Instant,
    ready: watch::Receiver<bool>,
) -> anyhow::Result<(Option<Duration>, Duration)> {
    let deadline = since + READY_TIMEOUT + LB_UP_TIMEOUT;
    let mut out_after = None;
    loop {
        let status = lb.status(slot).await?;
        if out_after.is_none() && status.iter().any(|s| haproxy::is_out(s)) {
            out_after = Some(since.elapsed());
        }
        let is_ready = *ready.borrow();
        if is_ready && status.iter().all(|s| haproxy::is_up(s)) {
            return Ok((out_after, since.elapsed()));
        }
        if !is_ready && ready.has_changed().is_err() {
            bail!("slot {slot}: the restart failed");
        }
        if Instant::now() > deadline {
            bail!("slot {slot} not back in the balancer within {READY_TIMEOUT:?} + {LB_UP_TIMEOUT:?}: {status:?}");
        }
        tokio::time::sleep(STATUS_POLL).await;
    }
}
