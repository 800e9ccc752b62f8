//! Target `team_file`: the team-file validator with positions, as
//! `ratelimit-config validate`/`generate` run it (`check_team_file`: JSON
//! syntax, the text scan for positions and duplicate keys, the rules), over
//! arbitrary text; and the scan alone, which is documented never to panic
//! on text that is not JSON.
//!
//! Checks: it never panics; every finding points inside the text (1-based
//! line and character column, at most one past the end of its line); a
//! file is accepted exactly when it has no error; and a file the CLI
//! accepts is accepted by the filter as the `limits` of its plugin
//! configuration, with the same model (the README's promise that the two
//! cannot disagree).

use ratelimit_config::parse_plugin_config;
use ratelimit_config::span::scan;
use ratelimit_config::team_file::check_team_file;

pub fn check(data: &[u8]) {
    // The CLI reads files with read_to_string: text that is not UTF-8 is
    // refused before the validator sees it.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = scan(text);
    let report = check_team_file("limits.json", text);
    let lines: Vec<&str> = text.split('\n').collect();
    for f in &report.findings {
        let line = f.at.line.checked_sub(1).and_then(|i| lines.get(i));
        let width = line.map_or(0, |l| l.chars().count());
        assert!(line.is_some(), "{f}: line outside the text");
        assert!(
            f.at.column >= 1 && f.at.column <= width + 1,
            "{f}: column outside its line"
        );
        let _ = f.to_string();
    }
    assert_eq!(report.parsed.is_some(), report.errors() == 0);
    if let Some((doc, limits)) = &report.parsed {
        let plugin = format!(
            r#"{{"domain": "d", "rate_limit_service": {{"cluster": "c"}}, "limits": {doc}}}"#
        );
        match parse_plugin_config(plugin.as_bytes()) {
            Ok((config, _)) => assert_eq!(&config.limits, limits),
            Err(e) => unreachable!("the CLI accepts what the filter refuses: {e:?}"),
        }
    }
}
