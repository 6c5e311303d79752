//! The reference design's test plan and edge cases (docs/invariants.md), against the real sequencer
//! on the in-memory storage with a shared runtime (bodies in `common/scenarios.rs`).

mod common;

use common::scenarios;

#[test]
fn basic_usage_continues_after_the_plog_and_persists_on_flush() {
    scenarios::basic_usage_continues_after_the_plog_and_persists_on_flush();
}

#[test]
fn actualization_after_an_error_hands_out_the_same_offset_and_numbers_again() {
    scenarios::actualization_after_an_error_hands_out_the_same_offset_and_numbers_again();
}

#[test]
fn dropping_an_unfinished_transaction_actualizes() {
    scenarios::dropping_an_unfinished_transaction_actualizes();
}

#[test]
fn an_event_written_despite_a_reported_error_is_found_by_actualization() {
    scenarios::an_event_written_despite_a_reported_error_is_found_by_actualization();
}

#[test]
fn several_storages_with_workspaces_and_kinds_continue_where_their_plog_ends() {
    scenarios::several_storages_with_workspaces_and_kinds_continue_where_their_plog_ends();
}

#[test]
fn new_must_start_actualization_and_start_is_busy_until_it_ends() {
    scenarios::new_must_start_actualization_and_start_is_busy_until_it_ends();
}

#[test]
fn long_recovery_gives_correct_numbers_for_any_tail_length() {
    scenarios::long_recovery_gives_correct_numbers_for_any_tail_length();
}

#[test]
fn multiple_actualizes_keep_numbers_strictly_increasing() {
    scenarios::multiple_actualizes_keep_numbers_strictly_increasing();
}

#[test]
fn flush_permanently_failing_makes_start_busy_over_the_limit_and_numbers_continue_after_healing() {
    scenarios::flush_permanently_failing_makes_start_busy_over_the_limit_and_numbers_continue_after_healing();
}
