//! Event encoding properties: every event round-trips, the allocation-free number scan agrees
//! with full decoding, so does the decoding that builds only the events a filter keeps, and random, mutated or truncated bytes give an error, never a panic; the
//! same for WLog references.

use monoseq_core::{Number, PLogOffset, SeqValue, WsId, WsKind};
use monoseq_store::{
    ARG_DEPTH_MAX, ArgObject, CRECORD_ID_SEQUENCE, DecodeError, EncodeError, Event,
    FORMAT_VERSION_WLOG_REF_BARE, Field, Idempotency, OWRECORD_ID_SEQUENCE, Record, RecordId,
    RecordKind, WLOG_OFFSET_SEQUENCE, WLogOffset, WLogRef, WLogTarget, decode_event_if,
    decode_idempotency, decode_numbers,
};
use proptest::prelude::*;

fn kind() -> impl Strategy<Value = RecordKind> {
    proptest::sample::select(RecordKind::ALL.to_vec())
}

fn field() -> impl Strategy<Value = Field> {
    (
        "[a-zA-Z_\u{e9}]{0,8}",
        proptest::collection::vec(any::<u8>(), 0..12),
    )
        .prop_map(|(n, v)| Field::new(n, v))
}

fn record() -> impl Strategy<Value = Record> {
    (
        any::<u64>(),
        kind(),
        "[a-z.]{0,10}",
        proptest::collection::vec(field(), 0..4),
    )
        .prop_map(|(id, kind, name, fields)| Record {
            id: RecordId(id),
            kind,
            name,
            fields,
        })
}

fn arg() -> impl Strategy<Value = ArgObject> {
    let leaf = (any::<u64>(), proptest::collection::vec(field(), 0..3)).prop_map(|(id, fields)| {
        ArgObject {
            id: RecordId(id),
            kind: RecordKind::ORecord,
            name: "app.Line".into(),
            fields,
            children: vec![],
        }
    });
    leaf.prop_recursive(4, 16, 3, |inner| {
        (any::<u64>(), proptest::collection::vec(inner, 0..3)).prop_map(|(id, children)| {
            ArgObject {
                id: RecordId(id),
                kind: RecordKind::ODoc,
                name: "app.Order".into(),
                fields: vec![Field::new("n", b"1".to_vec())],
                children,
            }
        })
    })
}

fn event() -> impl Strategy<Value = Event> {
    (
        (
            any::<u64>(),
            any::<u64>(),
            any::<u16>(),
            any::<u64>(),
            any::<u64>(),
        ),
        "[a-z.]{0,12}",
        proptest::option::of(arg()),
        proptest::collection::vec(record(), 0..4),
        proptest::collection::vec(record(), 0..3),
        proptest::option::of((
            "[ -~]{1,40}",
            any::<u64>(),
            proptest::collection::vec((1..65_536u64, any::<u64>()), 0..4),
        )),
    )
        .prop_map(
            |((plog, ws, kind, wlog, at), command, argument, created, updated, key)| Event {
                plog_offset: PLogOffset(plog),
                ws: WsId(ws),
                ws_kind: WsKind(kind),
                wlog_offset: WLogOffset(wlog),
                registered_at_ms: at,
                command,
                argument,
                created,
                updated,
                idempotency: key.map(|(key, fingerprint, raw_ids)| Idempotency {
                    key,
                    fingerprint,
                    raw_ids,
                }),
            },
        )
}

fn numbers_of(e: &Event) -> Vec<SeqValue> {
    let mut v = Vec::new();
    e.for_each_number(|seq, n| v.push(SeqValue::new(e.ws, seq, n)));
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_event_round_trips(e in event()) {
        let bytes = e.encode().unwrap();
        prop_assert_eq!(Event::decode(&bytes).unwrap(), e.clone());
        let mut nums = Vec::new();
        let head = decode_numbers(&bytes, &mut nums).unwrap();
        prop_assert_eq!(head.plog_offset, e.plog_offset);
        prop_assert_eq!(head.ws, e.ws);
        prop_assert_eq!(head.ws_kind, e.ws_kind);
        prop_assert_eq!(head.wlog_offset, e.wlog_offset);
        prop_assert_eq!(nums, numbers_of(&e));
        let (peeked, kept) = decode_event_if(&bytes, |p| p.command == e.command.as_bytes()).unwrap();
        prop_assert_eq!(peeked, head);
        prop_assert_eq!(kept, Some(e.clone()));
        prop_assert_eq!(decode_event_if(&bytes, |_| false).unwrap(), (head, None));
        prop_assert_eq!(decode_idempotency(&bytes).unwrap(), (head, e.idempotency.clone()));
    }

    #[test]
    fn the_encoded_length_is_the_length_of_the_encoding(e in event()) {
        let encoded = e.encode().map(|b| b.len()).map_err(|err| err.to_string());
        prop_assert_eq!(e.encoded_len().map_err(|err| err.to_string()), encoded);
    }

    #[test]
    fn random_bytes_give_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let full = Event::decode(&bytes);
        let mut nums = Vec::new();
        let scan = decode_numbers(&bytes, &mut nums);
        prop_assert!(full.is_err() || scan.is_ok());
    }

    #[test]
    fn random_body_with_a_valid_checksum_gives_an_error_not_a_panic(
        body in proptest::collection::vec(any::<u8>(), 0..256)
    ) {
        // Past the checksum, the structural checks alone must hold.
        let mut bytes = vec![1u8];
        bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        let full = Event::decode(&bytes);
        let mut nums = Vec::new();
        let scan = decode_numbers(&bytes, &mut nums);
        // The scan skips the UTF-8 check of names: it accepts at least what decode accepts.
        prop_assert!(full.is_err() || scan.is_ok());
        agrees_with_decoding(&bytes)?;
        if let Ok(e) = full {
            prop_assert_eq!(e.encode().unwrap(), bytes);
        }
    }

    #[test]
    fn mutated_encoding_is_rejected(e in event(), at in any::<prop::sample::Index>(), xor in 1u8..=255) {
        let mut bytes = e.encode().unwrap();
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        prop_assert!(Event::decode(&bytes).is_err());
        prop_assert!(decode_numbers(&bytes, &mut Vec::new()).is_err());
        prop_assert!(decode_event_if(&bytes, |_| false).is_err(), "dropped or not, damage is seen");
        prop_assert!(decode_event_if(&bytes, |_| true).is_err());
        prop_assert!(decode_idempotency(&bytes).is_err());
    }

    #[test]
    fn truncated_encoding_is_rejected(e in event(), at in any::<prop::sample::Index>()) {
        let bytes = e.encode().unwrap();
        let cut = &bytes[..at.index(bytes.len())];
        prop_assert!(Event::decode(cut).is_err());
        prop_assert!(decode_numbers(cut, &mut Vec::new()).is_err());
        prop_assert!(decode_event_if(cut, |_| false).is_err());
        prop_assert!(decode_event_if(cut, |_| true).is_err());
        prop_assert!(decode_idempotency(cut).is_err());
    }

    #[test]
    fn every_wlog_reference_round_trips_and_a_mutated_or_cut_one_is_rejected(
        partition in any::<u32>(),
        plog in any::<u64>(),
        event_crc in any::<u32>(),
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        let r = WLogRef {
            partition: monoseq_store::PartitionId(partition),
            plog_offset: PLogOffset(plog),
            event_crc,
        };
        let mut bytes = Vec::new();
        r.encode_into(&mut bytes);
        prop_assert!((11..=24).contains(&bytes.len()), "{} bytes", bytes.len());
        prop_assert_eq!(WLogRef::decode(&bytes).unwrap(), r);
        let target = WLogTarget::decode(&bytes).unwrap();
        prop_assert_eq!(
            (target.partition, target.plog_offset, target.event_crc),
            (Some(r.partition), r.plog_offset, event_crc)
        );
        // An event decoder meeting a reference names its version, never misreads it.
        prop_assert_eq!(Event::decode(&bytes).unwrap_err(), DecodeError::UnsupportedVersion(3));
        let i = at.index(bytes.len());
        prop_assert!(WLogRef::decode(&bytes[..i]).is_err());
        prop_assert!(WLogTarget::decode(&bytes[..i]).is_err());
        bytes[i] ^= xor;
        prop_assert!(WLogRef::decode(&bytes).is_err());
        prop_assert!(WLogTarget::decode(&bytes).is_err());
    }

    #[test]
    fn a_bare_wlog_reference_decodes_as_encoded_and_a_cut_one_does_not(
        partition in any::<u32>(),
        plog in any::<u64>(),
        event_crc in any::<u32>(),
        at in any::<prop::sample::Index>(),
    ) {
        let r = WLogRef {
            partition: monoseq_store::PartitionId(partition),
            plog_offset: PLogOffset(plog),
            event_crc,
        };
        let mut bytes = Vec::new();
        r.encode_bare_into(&mut bytes);
        prop_assert!((7..=20).contains(&bytes.len()), "{} bytes", bytes.len());
        prop_assert_eq!(WLogRef::decode(&bytes).unwrap(), r);
        let target = WLogTarget::decode(&bytes).unwrap();
        prop_assert_eq!(
            (target.partition, target.plog_offset, target.event_crc),
            (Some(r.partition), r.plog_offset, event_crc)
        );
        prop_assert_eq!(
            Event::decode(&bytes).unwrap_err(),
            DecodeError::UnsupportedVersion(FORMAT_VERSION_WLOG_REF_BARE)
        );
        let i = at.index(bytes.len());
        prop_assert!(WLogRef::decode(&bytes[..i]).is_err());
        prop_assert!(WLogTarget::decode(&bytes[..i]).is_err());
        bytes.push(0);
        prop_assert!(WLogRef::decode(&bytes).is_err());
    }

    #[test]
    fn a_wlog_reference_whose_version_byte_says_event_is_no_wlog_entry(
        partition in 0u32..128,
        plog in 0u64..128,
        event_crc in any::<u32>(),
        version in 1u8..=2,
    ) {
        // The body of a small reference parses as an event's head: only the whole event's
        // structure tells the two apart.
        let r = WLogRef {
            partition: monoseq_store::PartitionId(partition),
            plog_offset: PLogOffset(plog),
            event_crc: event_crc & 0x7f7f_7f7f,
        };
        let mut bytes = Vec::new();
        r.encode_into(&mut bytes);
        bytes[0] = version;
        prop_assert!(WLogTarget::decode(&bytes).is_err());
    }

    #[test]
    fn random_bytes_are_no_wlog_entry_without_a_valid_checksum(
        bytes in proptest::collection::vec(any::<u8>(), 0..64)
    ) {
        // Never a panic; a reference or a copy only with a checksum that holds, or a bare
        // reference (version 5), whose reader checks the event it names.
        if let Ok(t) = WLogTarget::decode(&bytes) {
            if bytes[0] == FORMAT_VERSION_WLOG_REF_BARE {
                prop_assert!(t.partition.is_some());
                return Ok(());
            }
            let crc = u32::from_le_bytes(bytes[1..5].try_into().unwrap());
            prop_assert_eq!(crc, crc32fast::hash(&bytes[5..]));
            prop_assert!(t.partition.is_some() || Event::decode(&bytes).is_ok());
        }
    }

    #[test]
    fn mutated_body_with_a_fixed_checksum_never_panics(
        e in event(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = e.encode().unwrap();
        for (at, b) in edits {
            let i = 5 + at.index(bytes.len() - 5);
            bytes[i] = b;
        }
        let keep = 5 + cut.index(bytes.len() - 4);
        bytes.truncate(keep);
        let crc = crc32fast::hash(&bytes[5..]);
        bytes[1..5].copy_from_slice(&crc.to_le_bytes());
        let full = Event::decode(&bytes);
        let scan = decode_numbers(&bytes, &mut Vec::new());
        prop_assert!(full.is_err() || scan.is_ok());
        agrees_with_decoding(&bytes)?;
    }
}

/// [`decode_event_if`] on `bytes`: an event it keeps is what [`Event::decode`] gives (or both
/// fail), and one it drops is checked as [`decode_numbers`] checks it; [`decode_idempotency`]
/// checks as [`decode_numbers`] does, and its key is the decoded event's.
fn agrees_with_decoding(bytes: &[u8]) -> Result<(), TestCaseError> {
    let full = Event::decode(bytes);
    let keyed = decode_idempotency(bytes);
    prop_assert_eq!(
        keyed.as_ref().map(|(head, _)| *head).ok(),
        decode_numbers(bytes, &mut Vec::new()).ok()
    );
    if let Ok(e) = &full {
        prop_assert_eq!(keyed.map(|(_, key)| key).ok(), Some(e.idempotency.clone()));
    }
    let kept = decode_event_if(bytes, |_| true).map(|(_, e)| e.expect("kept"));
    prop_assert_eq!(kept, full);
    let dropped = decode_event_if(bytes, |_| false);
    let scan = decode_numbers(bytes, &mut Vec::new());
    prop_assert_eq!(dropped.map(|(head, _)| head), scan);
    Ok(())
}

fn simple_event() -> Event {
    Event {
        plog_offset: PLogOffset(5),
        ws: WsId(1001),
        ws_kind: WsKind(3),
        wlog_offset: WLogOffset(2),
        registered_at_ms: 1_700_000_000_000,
        command: "app.MakeOrder".into(),
        argument: Some(ArgObject {
            id: RecordId(322_680_000_131_072),
            kind: RecordKind::ODoc,
            name: "app.Order".into(),
            fields: vec![Field::new("customer", br#""Ann""#.to_vec())],
            children: vec![ArgObject {
                id: RecordId(322_680_000_131_073),
                kind: RecordKind::ORecord,
                name: "app.OrderLine".into(),
                fields: vec![Field::new("qty", b"2".to_vec())],
                children: vec![],
            }],
        }),
        created: vec![
            Record {
                id: RecordId(322_685_000_131_072),
                kind: RecordKind::CDoc,
                name: "app.Customer".into(),
                fields: vec![],
            },
            Record {
                id: RecordId(322_680_000_131_074),
                kind: RecordKind::WDoc,
                name: "app.Invoice".into(),
                fields: vec![],
            },
        ],
        updated: vec![Record {
            id: RecordId(322_685_000_131_000),
            kind: RecordKind::CDoc,
            name: "app.Customer".into(),
            fields: vec![Field::new("name", br#""Bob""#.to_vec())],
        }],
        idempotency: None,
    }
}

#[test]
fn numbers_cover_wlog_offset_argument_and_created_records_but_not_updates() {
    let e = simple_event();
    let ws = e.ws;
    let nums = numbers_of(&e);
    assert_eq!(
        nums,
        vec![
            SeqValue::new(ws, WLOG_OFFSET_SEQUENCE.id, Number(2)),
            SeqValue::new(ws, OWRECORD_ID_SEQUENCE.id, Number(322_680_000_131_072)),
            SeqValue::new(ws, OWRECORD_ID_SEQUENCE.id, Number(322_680_000_131_073)),
            SeqValue::new(ws, CRECORD_ID_SEQUENCE.id, Number(322_685_000_131_072)),
            SeqValue::new(ws, OWRECORD_ID_SEQUENCE.id, Number(322_680_000_131_074)),
        ]
    );
}

#[test]
fn encoding_of_a_known_event_is_stable() {
    // The first bytes pin the header layout of format version 1 (docs/format.md).
    let bytes = simple_event().encode().unwrap();
    assert_eq!(bytes[0], 1, "version byte");
    assert_eq!(
        &bytes[5..10],
        &[5, 0xe9, 0x07, 3, 2],
        "PLog offset, workspace 1001, kind, WLog offset"
    );
    assert_eq!(Event::decode(&bytes).unwrap(), simple_event());
}

#[test]
fn unknown_version_is_refused_with_the_version_named() {
    let mut bytes = simple_event().encode().unwrap();
    bytes[0] = 3;
    assert_eq!(
        Event::decode(&bytes).unwrap_err(),
        DecodeError::UnsupportedVersion(3)
    );
}

#[test]
fn an_event_without_a_key_keeps_version_1_and_a_keyed_one_round_trips_as_version_2() {
    let plain = simple_event();
    assert_eq!(plain.encode().unwrap()[0], 1);
    let mut keyed = simple_event();
    keyed.idempotency = Some(Idempotency {
        key: "order-42/attempt".into(),
        fingerprint: 0xfeed_beef,
        raw_ids: vec![(1, 322_685_000_131_072), (2, 322_680_000_131_074)],
    });
    let bytes = keyed.encode().unwrap();
    assert_eq!(bytes[0], 2);
    assert_eq!(Event::decode(&bytes).unwrap(), keyed);
    let mut scanned = Vec::new();
    decode_numbers(&bytes, &mut scanned).unwrap();
    assert_eq!(scanned, numbers_of(&keyed));
}

#[test]
fn empty_bytes_are_truncated() {
    assert!(matches!(
        Event::decode(&[]).unwrap_err(),
        DecodeError::Truncated { .. }
    ));
}

#[test]
fn argument_of_a_non_operation_kind_is_refused_and_leaves_the_buffer_alone() {
    let mut e = simple_event();
    if let Some(a) = &mut e.argument {
        a.children[0].kind = RecordKind::CRecord;
    }
    let mut out = vec![9, 9];
    let err = e.encode_into(&mut out).unwrap_err();
    assert!(matches!(err, EncodeError::ArgumentKind { .. }), "{err}");
    assert_eq!(out, vec![9, 9]);
    assert_eq!(
        e.encoded_len().unwrap_err(),
        err,
        "the length check refuses it alike"
    );
}

#[test]
fn argument_nesting_is_bounded_both_ways() {
    let mut a = ArgObject {
        id: RecordId(1),
        kind: RecordKind::ORecord,
        name: String::new(),
        fields: vec![],
        children: vec![],
    };
    for _ in 1..ARG_DEPTH_MAX {
        a = ArgObject {
            children: vec![a.clone()],
            ..a
        };
    }
    let mut e = simple_event();
    e.argument = Some(a.clone());
    let bytes = e.encode().unwrap();
    assert_eq!(Event::decode(&bytes).unwrap(), e);

    e.argument = Some(ArgObject {
        children: vec![a],
        ..e.argument.clone().unwrap()
    });
    assert_eq!(e.encode().unwrap_err(), EncodeError::ArgumentTooDeep);
    assert_eq!(e.encoded_len().unwrap_err(), EncodeError::ArgumentTooDeep);
}

#[test]
fn an_event_past_the_size_limit_is_refused_by_its_length_alone_as_by_its_encoding() {
    let mut e = simple_event();
    e.command = "x".repeat(monoseq_store::EVENT_BYTES_MAX);
    let err = e.encode().unwrap_err();
    assert!(matches!(err, EncodeError::TooLarge { len } if len > monoseq_store::EVENT_BYTES_MAX));
    assert_eq!(e.encoded_len().unwrap_err(), err);
    e.command = "x".repeat(monoseq_store::EVENT_BYTES_MAX - 200);
    assert_eq!(e.encoded_len().unwrap(), e.encode().unwrap().len());
}

#[test]
fn numbers_scan_ignores_names_that_are_not_utf8_but_decode_refuses_them() {
    let e = simple_event();
    let mut bytes = e.encode().unwrap();
    // The command name starts right after the five header varints.
    let at = bytes.iter().position(|&b| b == b'a').unwrap();
    bytes[at] = 0xff;
    let crc = crc32fast::hash(&bytes[5..]);
    bytes[1..5].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        Event::decode(&bytes).unwrap_err(),
        DecodeError::InvalidUtf8 { .. }
    ));
    let mut nums = Vec::new();
    decode_numbers(&bytes, &mut nums).unwrap();
    assert_eq!(nums, numbers_of(&e));
}
