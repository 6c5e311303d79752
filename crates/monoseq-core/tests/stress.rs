//! Stress: the whole seed plan in a loop, on several threads at once sharing one runtime (the
//! reference design's "run the suite many times" race test, docs/invariants.md).
//! `MONOSEQ_STRESS_ROUNDS` sets the rounds.

mod common;

use common::scenarios;

const ROUNDS_DEFAULT: usize = 3;
const THREADS: usize = 4;

#[test]
fn the_seed_plan_passes_in_a_loop_on_concurrent_threads() {
    let rounds = std::env::var("MONOSEQ_STRESS_ROUNDS")
        .ok()
        .map_or(ROUNDS_DEFAULT, |s| {
            s.parse().expect("MONOSEQ_STRESS_ROUNDS must be a number")
        });
    let suite: &[fn()] = &[
        scenarios::basic_usage_continues_after_the_plog_and_persists_on_flush,
        scenarios::actualization_after_an_error_hands_out_the_same_offset_and_numbers_again,
        scenarios::dropping_an_unfinished_transaction_actualizes,
        scenarios::an_event_written_despite_a_reported_error_is_found_by_actualization,
        scenarios::several_storages_with_workspaces_and_kinds_continue_where_their_plog_ends,
        scenarios::new_must_start_actualization_and_start_is_busy_until_it_ends,
        scenarios::long_recovery_gives_correct_numbers_for_any_tail_length,
        scenarios::multiple_actualizes_keep_numbers_strictly_increasing,
        scenarios::flush_permanently_failing_makes_start_busy_over_the_limit_and_numbers_continue_after_healing,
    ];
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                for _ in 0..rounds {
                    // Each thread starts at another case, so different cases overlap.
                    for i in 0..suite.len() {
                        suite[(i + t) % suite.len()]();
                    }
                }
            });
        }
    });
}
