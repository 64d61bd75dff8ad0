//! What changed between two member lists, found without copying them.
//!
//! The services ([`crate::names`], [`crate::groups`]) are handed the whole member list after
//! every membership event; in a cluster of n nodes forming, that is n lists of up to n members
//! at each of n nodes. Rebuilding a service's copy each time (clone, sort, hash every member)
//! costs n³ over the cluster — minutes of CPU at 512 nodes. [`diff`] walks the two sorted lists
//! once and clones only the members that came or went; [`apply`] edits a sorted list in place.

use std::cmp::Ordering;

/// Beyond this many changes at once, [`apply`] rebuilds the list instead of editing it.
const EDITS: usize = 32;

/// The members that came and went from `old` (sorted, without duplicates) to `new` (any
/// order, duplicates allowed), each sorted, `skip` left out of both. One merge pass when
/// `new` is sorted (the drivers' lists are); otherwise a sorted copy of `new` first.
pub(crate) fn diff<P: Ord + Clone>(old: &[P], new: &[P], skip: Option<&P>) -> (Vec<P>, Vec<P>) {
    let sorted;
    let new: &[P] = if new.windows(2).all(|w| w[0] < w[1]) {
        new
    } else {
        let mut v = new.to_vec();
        v.sort_unstable();
        v.dedup();
        sorted = v;
        &sorted
    };
    let (mut came, mut went) = (Vec::new(), Vec::new());
    let (mut a, mut b) = (old.iter().peekable(), new.iter().peekable());
    loop {
        let step = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => break,
        };
        match step {
            Ordering::Equal => {
                a.next();
                b.next();
            }
            Ordering::Less => went.extend(a.next().cloned()),
            Ordering::Greater => came.extend(b.next().cloned()),
        }
    }
    if let Some(skip) = skip {
        came.retain(|p| p != skip);
        went.retain(|p| p != skip);
    }
    (came, went)
}

/// Edits `list` (sorted, without duplicates) by the outcome of [`diff`]: removes `went`, adds
/// `came`, keeping it sorted, and tells `edited` each change it made (see [`Edit`]) so that a
/// table kept in step with `list` can follow. Many changes at once rebuild the list instead.
pub(crate) fn apply<P: Ord + Clone>(
    list: &mut Vec<P>,
    came: &[P],
    went: &[P],
    mut edited: impl FnMut(Edit<'_, P>),
) {
    if came.len() + went.len() > EDITS {
        let mut merged: Vec<P> = std::mem::take(list)
            .into_iter()
            .filter(|p| went.binary_search(p).is_err())
            .collect();
        merged.extend(came.iter().cloned());
        merged.sort_unstable();
        merged.dedup();
        *list = merged;
        edited(Edit::Rebuilt);
        return;
    }
    for p in went {
        if let Ok(i) = list.binary_search(p) {
            list.remove(i);
            edited(Edit::Removed(i));
        }
    }
    for p in came {
        if let Err(i) = list.binary_search(p) {
            list.insert(i, p.clone());
            edited(Edit::Inserted(i, p));
        }
    }
}

/// One change [`apply`] made to a list.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Edit<'a, P> {
    /// This element was inserted at this index.
    Inserted(usize, &'a P),
    /// The element at this index was removed.
    Removed(usize),
    /// The list was rebuilt: a table kept in step must be rebuilt from it.
    Rebuilt,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the lists, the diff applied to the old list gives the new one (sorted,
        /// deduplicated, without the skipped element), and a table kept in step by the edits
        /// matches it.
        #[test]
        fn diff_then_apply_gives_the_new_list(
            old in proptest::collection::btree_set(0u16..200, 0..80),
            new in proptest::collection::vec(0u16..200, 0..120),
            skip in proptest::option::of(0u16..200),
        ) {
            let old: Vec<u16> = old.into_iter().filter(|p| Some(*p) != skip).collect();
            let (came, went) = diff(&old, &new, skip.as_ref());
            let mut want: Vec<u16> = new.iter().copied().filter(|p| Some(*p) != skip).collect();
            want.sort_unstable();
            want.dedup();
            prop_assert!(came.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(went.windows(2).all(|w| w[0] < w[1]));
            let mut list = old.clone();
            let mut keys: Vec<u32> = old.iter().map(|p| u32::from(*p) * 3).collect();
            let mut rebuilt = false;
            apply(&mut list, &came, &went, |e| match e {
                Edit::Inserted(i, p) => keys.insert(i, u32::from(*p) * 3),
                Edit::Removed(i) => { keys.remove(i); }
                Edit::Rebuilt => rebuilt = true,
            });
            if rebuilt {
                keys = list.iter().map(|p| u32::from(*p) * 3).collect();
            }
            prop_assert_eq!(&list, &want);
            prop_assert_eq!(keys, want.iter().map(|p| u32::from(*p) * 3).collect::<Vec<_>>());
            prop_assert_eq!(rebuilt, came.len() + went.len() > EDITS);
        }
    }

    #[test]
    fn an_unchanged_list_has_no_diff() {
        let l = vec![1, 4, 9];
        assert_eq!(diff(&l, &l, None), (vec![], vec![]));
        assert_eq!(diff(&l, &[9, 4, 1, 4], None), (vec![], vec![]));
        assert_eq!(diff(&l, &[4, 9], Some(&1)), (vec![], vec![]));
        assert_eq!(diff(&l, &[1, 5], None), (vec![5], vec![4, 9]));
    }
}
