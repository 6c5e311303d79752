//! [`Partitions`]: which partitions a node holds and whether each takes a command, decided
//! once for the processor on tokio and for the simulated node. A partition is held from its
//! acquisition (a second acquisition leaves it as it is) to its release; it takes commands
//! while held and not fenced (another node's lease epoch refused one of its writes). No I/O:
//! what a held partition is (a task's queue, a hand-driven writer) is the caller's, and the
//! caller says, through [`Held::fenced`], whether the storage fenced it off.

use std::sync::RwLock;

use crate::error::{CommandError, ConfigError};

/// A partition as its holder keeps it.
pub trait Held {
    /// Its storage refused a write because another node took the partition over.
    fn fenced(&self) -> bool;
}

/// The partitions `0..count` of one node, each held or not. Every partition has its own lock,
/// so that commands for different partitions never wait for each other.
pub struct Partitions<P> {
    slots: Vec<RwLock<Option<P>>>,
}

impl<P: Held> Partitions<P> {
    /// `count` partitions, none held.
    #[must_use]
    pub fn new(count: u32) -> Partitions<P> {
        Partitions {
            slots: (0..count).map(|_| RwLock::new(None)).collect(),
        }
    }

    /// Holds partition `p` as `start` makes it, unless it is held already (then it is left as
    /// it is and `start` is not called); whether it was acquired now.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Partitions`] for a partition not below the count; `start`'s error.
    pub fn acquire(
        &self,
        p: u32,
        start: impl FnOnce() -> Result<P, ConfigError>,
    ) -> Result<bool, ConfigError> {
        let slot = self
            .slots
            .get(p as usize)
            .ok_or(ConfigError::Partitions(p))?;
        let mut slot = slot.write().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Ok(false);
        }
        *slot = Some(start()?);
        Ok(true)
    }

    /// Stops holding partition `p`; what was held, if anything.
    pub fn release(&self, p: u32) -> Option<P> {
        let slot = self.slots.get(p as usize)?;
        slot.write().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Whether partition `p` takes commands here now: held and not fenced.
    #[must_use]
    pub fn serves(&self, p: u32) -> bool {
        self.admit(p, |_| ()).is_ok()
    }

    /// Whether partition `p` is held here (fenced or not).
    #[must_use]
    pub fn holds(&self, p: u32) -> bool {
        self.held(p, |_| ()).is_some()
    }

    /// What `look` makes of partition `p` when it is held here (fenced or not).
    pub fn held<R>(&self, p: u32, look: impl FnOnce(&P) -> R) -> Option<R> {
        let slot = self.slots.get(p as usize)?;
        slot.read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(look)
    }

    /// What `take` makes of partition `p` when it takes commands here now.
    ///
    /// # Errors
    ///
    /// [`CommandError::NotOwner`] when `p` is not held here, or fenced.
    pub fn admit<R>(&self, p: u32, take: impl FnOnce(&P) -> R) -> Result<R, CommandError> {
        let slot = self.slots.get(p as usize);
        let slot = slot.map(|s| s.read().unwrap_or_else(|e| e.into_inner()));
        match slot.as_deref() {
            Some(Some(held)) if !held.fenced() => Ok(take(held)),
            _ => Err(CommandError::NotOwner { partition: p }),
        }
    }

    /// What `f` makes of each held partition (fenced or not), in order.
    pub fn each<R>(&self, mut f: impl FnMut(u32, &P) -> R) -> Vec<R> {
        let mut out = Vec::new();
        for (p, slot) in self.slots.iter().enumerate() {
            let slot = slot.read().unwrap_or_else(|e| e.into_inner());
            if let Some(held) = slot.as_ref() {
                out.push(f(u32::try_from(p).unwrap_or(u32::MAX), held));
            }
        }
        out
    }

    /// The held partitions whose storage fenced them off: they take no command and wait to be
    /// released.
    #[must_use]
    pub fn fenced(&self) -> Vec<u32> {
        self.each(|p, held| held.fenced().then_some(p))
            .into_iter()
            .flatten()
            .collect()
    }

    /// Held partition `p`, to change it (its holder alone reaches it).
    pub fn get_mut(&mut self, p: u32) -> Option<&mut P> {
        let slot = self.slots.get_mut(p as usize)?;
        slot.get_mut().unwrap_or_else(|e| e.into_inner()).as_mut()
    }

    /// Releases every partition; what was held, in order.
    pub fn release_all(&self) -> Vec<P> {
        (0..self.slots.len())
            .filter_map(|p| self.release(u32::try_from(p).unwrap_or(u32::MAX)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Part {
        fenced: bool,
        id: u32,
    }

    impl Held for Part {
        fn fenced(&self) -> bool {
            self.fenced
        }
    }

    fn part(id: u32) -> Result<Part, ConfigError> {
        Ok(Part { fenced: false, id })
    }

    #[test]
    fn a_held_partition_takes_commands_until_fenced_or_released() {
        let mut t: Partitions<Part> = Partitions::new(2);
        let not_owner = |p| Err(CommandError::NotOwner { partition: p });
        assert_eq!(t.admit(0, |x| x.id), not_owner(0));
        assert!(t.acquire(0, || part(7)).unwrap());
        assert_eq!(t.admit(0, |x| x.id), Ok(7));
        assert!(
            !t.acquire(0, || part(8)).unwrap(),
            "a second acquisition leaves it as it is"
        );
        assert_eq!(t.admit(0, |x| x.id), Ok(7));
        t.get_mut(0).unwrap().fenced = true;
        assert_eq!(t.admit(0, |x| x.id), not_owner(0));
        assert!(!t.serves(0) && t.holds(0));
        assert_eq!(t.fenced(), vec![0]);
        assert_eq!(t.release(0).map(|x| x.id), Some(7));
        assert!(!t.holds(0) && t.fenced().is_empty());
        assert!(matches!(
            t.acquire(2, || part(1)),
            Err(ConfigError::Partitions(2))
        ));
        assert_eq!(t.admit(2, |x| x.id), not_owner(2));
    }
}
