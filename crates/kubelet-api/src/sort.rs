//! Stable sorting through one shared routine: [`by`] and [`by_key`].
//!
//! The standard library's stable sort is compiled anew for every element type and comparison
//! (about 3.8 KB each), and the SDK sorts some forty different things (containers by creation,
//! pods by priority, paths, names). These functions sort a list of positions with one compiled
//! sort that calls the comparison through a reference, then move the elements into that order:
//! the same result as `slice::sort_by` (stable: equal elements keep their order), at the cost of
//! one indirect call per comparison, on lists that are short. A binary holds one sort instead of
//! one per call site.

use std::cmp::Ordering;

/// Sort `items` by `compare`, stably (as `items.sort_by(compare)` does).
pub fn by<T>(items: &mut [T], compare: impl Fn(&T, &T) -> Ordering) {
    if items.len() < 2 {
        return;
    }
    let order = sorted_positions(items.len(), &|a, b| compare(&items[a], &items[b]));
    permute(items, order);
}

/// Sort `items` by the key `key` gives each, stably (as `items.sort_by_key(key)` does).
pub fn by_key<T, K: Ord>(items: &mut [T], key: impl Fn(&T) -> K) {
    by(items, |a, b| key(a).cmp(&key(b)));
}

/// The positions `0..len` in the order `compare` gives them (equal ones in ascending position).
#[inline(never)]
fn sorted_positions(len: usize, compare: &dyn Fn(usize, usize) -> Ordering) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    order.sort_by(|&a, &b| compare(a, b));
    order
}

/// Move the element at `order[i]` to position `i`, for every `i`, following each cycle of the
/// permutation with swaps.
fn permute<T>(items: &mut [T], mut order: Vec<usize>) {
    const DONE: usize = usize::MAX;
    for start in 0..items.len() {
        if order[start] == DONE {
            continue;
        }
        let mut at = start;
        loop {
            let from = order[at];
            order[at] = DONE;
            if from == start {
                break;
            }
            items.swap(at, from);
            at = from;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A small deterministic generator, so the test needs no dependency.
    fn numbers(seed: u64, n: usize, modulo: u64) -> Vec<u64> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % modulo
            })
            .collect()
    }

    #[test]
    fn the_same_order_as_the_standard_stable_sort() {
        for seed in 0..200u64 {
            let len = (seed % 40) as usize;
            // Pairs of (key, original position): few distinct keys, so ties are common and
            // stability shows.
            let items: Vec<(u64, usize)> = numbers(seed, len, 5)
                .into_iter()
                .enumerate()
                .map(|(i, k)| (k, i))
                .collect();
            let mut expected = items.clone();
            expected.sort_by_key(|p| p.0);
            let mut got = items.clone();
            by_key(&mut got, |p| p.0);
            assert_eq!(got, expected, "seed {seed}");
            let mut descending = items.clone();
            by(&mut descending, |a, b| b.0.cmp(&a.0));
            let mut expected = items;
            expected.sort_by_key(|p| std::cmp::Reverse(p.0));
            assert_eq!(descending, expected, "seed {seed}");
        }
    }

    #[test]
    fn owned_values_move_without_loss() {
        let mut names: Vec<String> = ["c", "a", "b", "a"].iter().map(|s| s.to_string()).collect();
        by(&mut names, |a, b| a.cmp(b));
        assert_eq!(names, ["a", "a", "b", "c"]);
        let mut empty: Vec<String> = Vec::new();
        by(&mut empty, |a, b| a.cmp(b));
        assert!(empty.is_empty());
    }
}
