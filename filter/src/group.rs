//! A group of the configuration, named by its position (`GroupId`): the
//! key of everything kept per group (`compiled::Compiled::group`, the
//! per-group counters), carried by every call and tracked tenant instead
//! of the group itself.

/// A group of the configuration: its position in `limits.all_groups()`
/// (the default group first, then the named ones, in file order), which is
/// also where its per-group counters are kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(usize);

impl GroupId {
    /// The group at this position in `limits.all_groups()`.
    pub const fn new(index: usize) -> GroupId {
        GroupId(index)
    }

    /// Its position in `limits.all_groups()` (and in every per-group table).
    pub const fn index(self) -> usize {
        self.0
    }
}
