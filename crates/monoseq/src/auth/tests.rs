//! The unit tests of the token settings and the request check.

use axum::http::{HeaderMap, HeaderValue, Method, header};

use super::check::{Auth, HEALTH_PATHS, Refusal};
use super::settings::*;

fn tokens_of(text: &str) -> anyhow::Result<Vec<Configured>> {
    parse_tokens_file(text, "tokens file t")
}

const W: &str = "w-0123456789abcdef";
const R: &str = "r-0123456789abcdef";
const A: &str = "a-0123456789abcdef";
const C: &str = "c-0123456789abcdef";

fn auth(text: &str, open_health: bool) -> Auth {
    Auth::new(&tokens_of(text).expect("valid tokens"), None, open_health)
}

fn with_bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::AUTHORIZATION,
        HeaderValue::try_from(format!("Bearer {token}")).unwrap(),
    );
    h
}

#[test]
fn a_tokens_file_takes_kinds_comments_and_blank_lines() {
    let text = format!("# tokens\n\nwrite {W}\n  read   {R}  \n");
    let tokens = tokens_of(&text).expect("valid");
    assert_eq!(tokens.len(), 2);
    assert_eq!(tokens[0].kind, Kind::Write);
    assert_eq!(tokens[1].kind, Kind::Read);
    assert_eq!(tokens[1].origin, "tokens file t line 4");
}

#[test]
fn a_malformed_line_is_named_by_number_and_its_token_is_not_repeated() {
    let secret = "s3cr3t-0123456789abcdef";
    for (text, line) in [
        (format!("write {W}\nowner {secret}\n"), 2),
        (format!("\n\n{secret}\n"), 3),
        (format!("read {secret} extra\n"), 1),
        ("write tiny1\n".to_owned(), 1),
        ("write\n".to_owned(), 1),
    ] {
        let err = format!("{:#}", tokens_of(&text).err().expect("refused"));
        assert!(err.contains(&format!("line {line}:")), "{err}");
        assert!(!err.contains(secret) && !err.contains("tiny1"), "{err}");
    }
}

#[test]
fn the_environment_list_takes_kind_colon_token_entries() {
    let tokens = parse_tokens_env(&format!("write:{W}, read:{R},")).expect("valid");
    assert_eq!(
        tokens.iter().map(|t| t.kind).collect::<Vec<_>>(),
        [Kind::Write, Kind::Read]
    );
    let err = parse_tokens_env(&format!("write:{W},{R}"))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("entry 2") && !err.contains(R), "{err}");
}

#[test]
fn a_token_configured_twice_is_refused() {
    let tokens = tokens_of(&format!("write {W}\nread {W}\n")).expect("parses");
    let err = check_distinct(&tokens).unwrap_err().to_string();
    assert!(
        err.contains("line 2 repeats the token of") && !err.contains(W),
        "{err}"
    );
}

#[test]
fn a_token_is_matched_to_its_kind() {
    let a = auth(&format!("write {W}\nread {R}\n"), false);
    assert_eq!(a.kind_of(W.as_bytes()), Some(Kind::Write));
    assert_eq!(a.kind_of(R.as_bytes()), Some(Kind::Read));
    assert_eq!(a.kind_of(b"w-0123456789abcdeX"), None);
    assert_eq!(a.kind_of(b""), None);
}

#[test]
fn a_read_token_may_only_get_and_a_write_token_everything() {
    let a = auth(&format!("write {W}\nread {R}\n"), false);
    let path = "/v1/commands";
    assert_eq!(
        a.authorize(&Method::POST, path, &HeaderMap::new()),
        Err(Refusal::Missing)
    );
    assert_eq!(
        a.authorize(&Method::POST, path, &with_bearer("nope-0123456789abcdef")),
        Err(Refusal::Invalid)
    );
    assert_eq!(
        a.authorize(&Method::POST, path, &with_bearer(R)),
        Err(Refusal::Scope(Kind::Read, Kind::Write))
    );
    assert_eq!(
        a.authorize(&Method::DELETE, path, &with_bearer(R)),
        Err(Refusal::Scope(Kind::Read, Kind::Write))
    );
    assert_eq!(a.authorize(&Method::GET, path, &with_bearer(R)), Ok(()));
    assert_eq!(a.authorize(&Method::HEAD, path, &with_bearer(R)), Ok(()));
    assert_eq!(a.authorize(&Method::POST, path, &with_bearer(W)), Ok(()));
    let mut lower = HeaderMap::new();
    lower.insert(
        header::AUTHORIZATION,
        HeaderValue::try_from(format!("bearer {W}")).unwrap(),
    );
    assert_eq!(a.authorize(&Method::POST, path, &lower), Ok(()));
    let mut basic = HeaderMap::new();
    basic.insert(
        header::AUTHORIZATION,
        HeaderValue::try_from(format!("Basic {W}")).unwrap(),
    );
    assert_eq!(
        a.authorize(&Method::GET, path, &basic),
        Err(Refusal::Missing)
    );
}

#[test]
fn a_consume_token_reads_sets_positions_and_joins_groups_and_nothing_else() {
    let a = auth(
        &format!("admin {A}\nwrite {W}\nconsume {C}\nread {R}\n"),
        false,
    );
    assert_eq!(a.kind_of(C.as_bytes()), Some(Kind::Consume));
    let position = "/v1/consumers/billing%2Fv2/partitions/3";
    let allowed = [
        (Method::GET, "/v1/partitions/0/events"),
        (Method::GET, "/v1/partitions/0/events/stream"),
        (Method::HEAD, "/v1/info"),
        (Method::GET, "/v1/consumers"),
        (Method::GET, position),
        (Method::PUT, position),
        (Method::GET, "/v1/groups/g"),
        (Method::POST, "/v1/groups/g/members"),
        (Method::POST, "/v1/groups/g/commit"),
        (Method::POST, "/v1/groups/g/heartbeat"),
        (Method::DELETE, "/v1/groups/g/members/m~1.0"),
        (Method::GET, "/metrics"),
    ];
    let refused = [
        (Method::POST, "/v1/commands", Kind::Write),
        (Method::POST, "/v1/commands/batch", Kind::Write),
        (Method::DELETE, "/v1/consumers/billing", Kind::Write),
        (Method::PUT, "/v1/consumers/billing", Kind::Write),
        (Method::PUT, "/v1/consumers/billing/partitions", Kind::Write),
        (Method::PUT, "/v1/consumers//partitions/3", Kind::Write),
        (Method::PUT, "/v1/consumers/a/partitions/3/x", Kind::Write),
        (
            Method::POST,
            "/v1/consumers/billing/partitions/3",
            Kind::Write,
        ),
        (Method::DELETE, "/v1/groups/g", Kind::Write),
        (Method::DELETE, "/v1/groups/g/members", Kind::Write),
        (Method::DELETE, "/v1/groups/g/members/s/x", Kind::Write),
        (Method::PUT, "/v1/groups/g", Kind::Write),
        (Method::POST, "/v1/groupsx", Kind::Write),
        (Method::POST, "/v1/sequences/s/n/next", Kind::Write),
        (Method::POST, "/v1/admin/backup", Kind::Admin),
        (Method::GET, "/v1/admin/backup", Kind::Admin),
    ];
    for (method, path) in &allowed {
        assert_eq!(
            a.authorize(method, path, &with_bearer(C)),
            Ok(()),
            "{method} {path}"
        );
        assert_eq!(a.authorize(method, path, &with_bearer(W)), Ok(()));
    }
    for (method, path, needed) in &refused {
        let expected = if *needed == Kind::Admin {
            Refusal::NotAdmin
        } else {
            Refusal::Scope(Kind::Consume, *needed)
        };
        assert_eq!(
            a.authorize(method, path, &with_bearer(C)),
            Err(expected),
            "{method} {path}"
        );
    }
    // A read token may not set a position or join a group; a write token may.
    for (method, path) in [
        (Method::PUT, position),
        (Method::POST, "/v1/groups/g/members"),
    ] {
        assert_eq!(
            a.authorize(&method, path, &with_bearer(R)),
            Err(Refusal::Scope(Kind::Read, Kind::Consume))
        );
        assert_eq!(a.authorize(&method, path, &with_bearer(A)), Ok(()));
    }
    let tokens = parse_tokens_env(&format!("consume:{C}")).expect("valid");
    assert_eq!(tokens[0].kind, Kind::Consume);
}

#[test]
fn health_is_open_only_when_asked_and_only_health() {
    let closed = auth(&format!("write {W}\n"), false);
    let open = auth(&format!("write {W}\n"), true);
    for path in HEALTH_PATHS {
        assert_eq!(
            closed.authorize(&Method::GET, path, &HeaderMap::new()),
            Err(Refusal::Missing)
        );
        assert_eq!(
            open.authorize(&Method::GET, path, &HeaderMap::new()),
            Ok(())
        );
    }
    assert_eq!(
        open.authorize(&Method::GET, "/metrics", &HeaderMap::new()),
        Err(Refusal::Missing)
    );
}

#[test]
fn without_tokens_everything_passes() {
    let a = Auth::new(&[], None, false);
    assert!(!a.is_on());
    assert_eq!(
        a.authorize(&Method::POST, "/v1/commands", &HeaderMap::new()),
        Ok(())
    );
    assert_eq!(a.outbound_authorization(), None);
}

#[test]
fn the_outbound_token_is_the_node_token_or_the_first_write_token() {
    let tokens = tokens_of(&format!("read {R}\nwrite {W}\n")).expect("valid");
    let first_write = Auth::new(&tokens, None, false);
    let header = first_write
        .outbound_authorization()
        .expect("a write token exists");
    assert_eq!(header.as_bytes(), format!("Bearer {W}").as_bytes());
    assert!(header.is_sensitive());
    let node: Token = "node-0123456789abcdef".parse().expect("valid");
    let given = Auth::new(&tokens, Some(node), false);
    assert_eq!(
        given.outbound_authorization().expect("given").as_bytes(),
        b"Bearer node-0123456789abcdef"
    );
    let read_only = Auth::new(&tokens_of(&format!("read {R}\n")).unwrap(), None, false);
    assert_eq!(read_only.outbound_authorization(), None);
}

#[test]
fn debug_shows_counts_and_never_a_token() {
    let node: Token = "node-0123456789abcdef".parse().expect("valid");
    let tokens = tokens_of(&format!("write {W}\nread {R}\n")).expect("valid");
    let a = Auth::new(&tokens, Some(node.clone()), true);
    let text = format!("{a:?} {node:?} {:?}", tokens[0].token);
    for secret in [W, R, "node-0123456789abcdef"] {
        assert!(!text.contains(secret), "{text}");
    }
    assert!(text.contains("write_tokens: 1"), "{text}");
}

fn resolve(args: &SecurityArgs, listen: &str, env: EnvSecrets) -> anyhow::Result<Security> {
    args.resolve_with(&SecurityFile::default(), listen.parse().unwrap(), env)
}

#[test]
fn a_non_loopback_listener_needs_tokens_or_an_explicit_allowance() {
    let none = SecurityArgs::default();
    let err = resolve(&none, "0.0.0.0:8080", EnvSecrets::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--tokens-file") && err.contains("--allow-unauthenticated"),
        "{err}"
    );
    assert!(resolve(&none, "127.0.0.1:8080", EnvSecrets::default()).is_ok());
    assert!(resolve(&none, "[::1]:8080", EnvSecrets::default()).is_ok());
    let allowed = SecurityArgs {
        allow_unauthenticated: true,
        ..SecurityArgs::default()
    };
    assert!(resolve(&allowed, "0.0.0.0:8080", EnvSecrets::default()).is_ok());
    let env = EnvSecrets {
        tokens: Some(format!("write:{W}")),
        node_token: None,
    };
    let on = resolve(&none, "0.0.0.0:8080", env).expect("tokens given");
    assert!(on.auth.is_on());
}

#[test]
fn the_node_token_comes_from_one_place() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node");
    std::fs::write(&file, "node-0123456789abcdef\n").unwrap();
    let args = SecurityArgs {
        node_token_file: Some(file),
        ..SecurityArgs::default()
    };
    let s = resolve(&args, "127.0.0.1:1", EnvSecrets::default()).expect("valid");
    assert_eq!(
        s.auth.outbound_authorization().unwrap().as_bytes(),
        b"Bearer node-0123456789abcdef"
    );
    let both = EnvSecrets {
        tokens: None,
        node_token: Some("node-0123456789abcdef".into()),
    };
    let err = resolve(&args, "127.0.0.1:1", both).unwrap_err().to_string();
    assert!(err.contains("given twice"), "{err}");
}

#[test]
fn a_token_argument_is_checked_when_used_and_never_quoted() {
    let short: TokenArg = "tiny1".parse().unwrap();
    let err = short.token("--token").unwrap_err().to_string();
    assert!(
        err.starts_with("--token: ") && !err.contains("tiny1"),
        "{err}"
    );
    assert_eq!(format!("{short:?}"), "TokenArg(<redacted>)");
    let good: TokenArg = W.parse().unwrap();
    assert_eq!(
        good.token("--token").unwrap().authorization().as_bytes(),
        format!("Bearer {W}").as_bytes()
    );
}

#[test]
fn the_settings_file_section_is_read_under_the_flags() {
    let section: SecurityFile =
        toml::from_str("open_health = true\ntls_cert = \"c.pem\"\n").expect("parses");
    assert_eq!(section.open_health, Some(true));
    let err = SecurityArgs::default()
        .resolve_with(
            &section,
            "127.0.0.1:1".parse().unwrap(),
            EnvSecrets::default(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("without --tls-key"), "{err}");
    assert!(toml::from_str::<SecurityFile>("tokens = \"x\"\n").is_err());
}

#[test]
fn an_admin_token_is_read_from_the_file_and_the_environment() {
    let tokens = tokens_of(&format!("admin {A}\nwrite {W}\n")).expect("valid");
    assert_eq!(tokens[0].kind, Kind::Admin);
    let env = parse_tokens_env(&format!("admin:{A},read:{R}")).expect("valid");
    assert_eq!(env[0].kind, Kind::Admin);
    let a = Auth::new(&tokens, None, false);
    assert_eq!(a.kind_of(A.as_bytes()), Some(Kind::Admin));
    assert_eq!(a.kind_of(W.as_bytes()), Some(Kind::Write));
    // An admin token is never presented to peers.
    let admin_only = Auth::new(&tokens_of(&format!("admin {A}\n")).unwrap(), None, false);
    assert_eq!(admin_only.outbound_authorization(), None);
}

#[test]
fn administration_needs_an_admin_token_which_may_send_everything() {
    let a = auth(&format!("admin {A}\nwrite {W}\nread {R}\n"), false);
    let backup = "/v1/admin/backup";
    assert!(backup.starts_with(crate::auth::ADMIN_PATH_PREFIX));
    for method in [Method::POST, Method::GET, Method::DELETE] {
        assert_eq!(
            a.authorize(&method, backup, &with_bearer(W)),
            Err(Refusal::NotAdmin),
            "{method}"
        );
        assert_eq!(
            a.authorize(&method, backup, &with_bearer(R)),
            Err(Refusal::NotAdmin),
            "{method}"
        );
        assert_eq!(a.authorize(&method, backup, &with_bearer(A)), Ok(()));
    }
    assert_eq!(
        a.authorize(&Method::POST, backup, &HeaderMap::new()),
        Err(Refusal::Missing)
    );
    assert_eq!(
        a.authorize(&Method::POST, "/v1/commands", &with_bearer(A)),
        Ok(())
    );
    assert_eq!(
        a.authorize(&Method::GET, "/v1/info", &with_bearer(A)),
        Ok(())
    );
    // Only the prefix with its slash is administration.
    assert_eq!(
        a.authorize(&Method::POST, "/v1/administer", &with_bearer(W)),
        Ok(())
    );
}

#[test]
fn without_tokens_administration_needs_admin_on_loopback() {
    let mut a = Auth::new(&[], None, false);
    let backup = "/v1/admin/backup";
    assert_eq!(
        a.authorize(&Method::POST, backup, &HeaderMap::new()),
        Err(Refusal::AdminOff)
    );
    assert_eq!(
        a.authorize(&Method::POST, "/v1/commands", &HeaderMap::new()),
        Ok(())
    );
    a.admin_on_loopback = true;
    assert_eq!(
        a.authorize(&Method::POST, backup, &HeaderMap::new()),
        Ok(())
    );
}

#[test]
fn admin_on_loopback_is_refused_with_tokens_or_off_loopback() {
    let flag = SecurityArgs {
        admin_on_loopback: true,
        ..SecurityArgs::default()
    };
    let on = resolve(&flag, "127.0.0.1:8080", EnvSecrets::default()).expect("loopback, no token");
    assert!(on.auth.admin_on_loopback);
    assert!(resolve(&flag, "[::1]:8080", EnvSecrets::default()).is_ok());
    let err = resolve(&flag, "0.0.0.0:8080", EnvSecrets::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("--tokens-file"), "{err}");
    let open = SecurityArgs {
        allow_unauthenticated: true,
        ..flag.clone()
    };
    let err = resolve(&open, "0.0.0.0:8080", EnvSecrets::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--admin-on-loopback") && err.contains("not a loopback address"),
        "{err}"
    );
    let env = EnvSecrets {
        tokens: Some(format!("write:{W}")),
        node_token: None,
    };
    let err = resolve(&flag, "127.0.0.1:8080", env)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--admin-on-loopback") && err.contains("admin <token>") && !err.contains(W),
        "{err}"
    );
    let off = resolve(
        &SecurityArgs::default(),
        "127.0.0.1:8080",
        EnvSecrets::default(),
    )
    .expect("defaults");
    assert!(!off.auth.admin_on_loopback);
}
