//! `--store` read into what to connect to, and the one way a store URL is
//! ever shown: [`redacted`].

use std::fmt;

/// The forms `--store` takes, as an error lists them.
pub const FORMS: &str = "memory, redis://[USER:PASSWORD@]HOST:PORT[/DB], \
rediss://[USER:PASSWORD@]HOST:PORT[/DB] (TLS), \
redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...], \
rediss-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...] (TLS), \
redis-sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB], \
rediss-sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB] (TLS)";

/// What a store URL names.
#[derive(Clone, PartialEq, Eq)]
pub enum Kind {
    Memory,
    /// One Redis server.
    Single,
    /// A Redis Cluster, from one or more of its nodes.
    Cluster,
    /// The master named so, found through the sentinels (`nodes`).
    Sentinel {
        master: String,
    },
}

/// A parsed `--store`.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: Kind,
    /// `rediss*://`: TLS to every node (and to the sentinels).
    pub tls: bool,
    pub nodes: Vec<(String, u16)>,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// Never prints the password.
impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("kind", &self.kind.name())
            .field("tls", &self.tls)
            .field("nodes", &self.nodes)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Kind {
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Single => "redis",
            Kind::Cluster => "redis-cluster",
            Kind::Sentinel { .. } => "redis-sentinel",
        }
    }
}

/// The URL with its credentials hidden: what a log line, an error or a
/// page may show. A password (and a lone userinfo, which may be one)
/// becomes `***`; a user name stays. Works on any string, parsed or not.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL: shown only if it cannot hold a secret.
        return if url.contains('@') || url.contains(':') {
            "***".to_string()
        } else {
            url.to_string()
        };
    };
    // The userinfo ends at the last '@' (a password may hold '@' or '/').
    match rest.rsplit_once('@') {
        None => url.to_string(),
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{hosts}"),
            None => format!("{scheme}://***@{hosts}"),
        },
    }
}

/// Reads `--store`. The error names the URL redacted and lists the forms.
pub fn parse(url: &str) -> Result<Target, String> {
    parse_inner(url).map_err(|why| {
        format!(
            "--store {}: {why}; the forms it takes: {FORMS}",
            redacted(url)
        )
    })
}

fn parse_inner(url: &str) -> Result<Target, String> {
    if url == "memory" {
        return Ok(Target {
            kind: Kind::Memory,
            tls: false,
            nodes: Vec::new(),
            db: 0,
            username: None,
            password: None,
        });
    }
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "not memory and not a URL".to_string())?;
    let (kind, tls) = match scheme {
        "redis" => (Kind::Single, false),
        "rediss" => (Kind::Single, true),
        "redis-cluster" => (Kind::Cluster, false),
        "rediss-cluster" => (Kind::Cluster, true),
        "redis-sentinel" => (
            Kind::Sentinel {
                master: String::new(),
            },
            false,
        ),
        "rediss-sentinel" => (
            Kind::Sentinel {
                master: String::new(),
            },
            true,
        ),
        other => return Err(format!("unknown scheme {other:?}")),
    };
    if rest.contains('?') || rest.contains('#') {
        return Err("no query or fragment is taken (TLS options are flags: --redis-ca, --redis-cert, --redis-key, --redis-insecure-skip-verify)".into());
    }
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, rest),
    };
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (rest, None),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(u) => {
            let (user, pass) = match u.split_once(':') {
                Some((user, pass)) => (user, Some(pass)),
                None => (u, None),
            };
            let user = decode(user).ok_or("a bad %-escape in the user name")?;
            let pass = pass
                .map(|p| decode(p).ok_or("a bad %-escape in the password"))
                .transpose()?;
            ((!user.is_empty()).then_some(user), pass)
        }
    };
    let nodes = authority
        .split(',')
        .map(host_port)
        .collect::<Result<Vec<_>, _>>()?;
    if nodes.len() > 1 && kind == Kind::Single {
        return Err(format!(
            "{scheme}:// takes one HOST:PORT (a Cluster: {scheme}-cluster://)"
        ));
    }
    let segments: Vec<&str> = path
        .map(|p| p.split('/').filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    let db_of = |s: &str| {
        s.parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| format!("the database {s:?} is not a number"))
    };
    let (kind, db) = match kind {
        Kind::Single => match segments.as_slice() {
            [] => (kind, 0),
            [db] => (kind, db_of(db)?),
            _ => return Err("the path takes one database number".into()),
        },
        Kind::Cluster => match segments.as_slice() {
            [] => (kind, 0),
            _ => return Err("a Cluster has no database: no path".into()),
        },
        Kind::Sentinel { .. } => match segments.as_slice() {
            [master] => (
                Kind::Sentinel {
                    master: (*master).to_string(),
                },
                0,
            ),
            [master, db] => (
                Kind::Sentinel {
                    master: (*master).to_string(),
                },
                db_of(db)?,
            ),
            _ => return Err("the master's name is missing: .../MASTER_NAME".into()),
        },
        Kind::Memory => (kind, 0),
    };
    Ok(Target {
        kind,
        tls,
        nodes,
        db,
        username,
        password,
    })
}

/// `HOST:PORT` or `[V6]:PORT`.
fn host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not HOST:PORT"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains(['[', ']', '@', '/']) {
        return Err(format!("{s:?} is not HOST:PORT"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{s:?}: the port is not a number from 1 to 65535"))?;
    Ok((host.to_string(), port))
}

/// `%XX` escapes decoded (a password may hold any byte).
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `REDIS_AUTH` (and `REDIS_SENTINEL_AUTH`) as envoyproxy/ratelimit takes
/// them: `user:password`, or a plain `password` (no ':').
pub fn split_auth(auth: &str) -> (Option<String>, String) {
    match auth.split_once(':') {
        Some((user, pass)) if !user.is_empty() => (Some(user.to_string()), pass.to_string()),
        Some((_, pass)) => (None, pass.to_string()),
        None => (None, auth.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_is_read() {
        let t = parse("memory").unwrap();
        assert!(t.kind == Kind::Memory);
        let t = parse("redis://127.0.0.1:6379").unwrap();
        assert!(t.kind == Kind::Single && !t.tls);
        assert_eq!(t.nodes, [("127.0.0.1".to_string(), 6379)]);
        assert_eq!((t.db, t.username, t.password), (0, None, None));
        let t = parse("rediss://rl:s3cr%40t@redis.example.com:6380/2").unwrap();
        assert!(t.kind == Kind::Single && t.tls);
        assert_eq!(t.nodes, [("redis.example.com".to_string(), 6380)]);
        assert_eq!(t.db, 2);
        assert_eq!(t.username.as_deref(), Some("rl"));
        assert_eq!(t.password.as_deref(), Some("s3cr@t"));
        let t = parse("redis://:pw@[::1]:6379/").unwrap();
        assert_eq!(t.nodes, [("::1".to_string(), 6379)]);
        assert_eq!((t.username, t.password.as_deref()), (None, Some("pw")));
        let t = parse("rediss-cluster://a:7000,b:7001").unwrap();
        assert!(t.kind == Kind::Cluster && t.tls);
        assert_eq!(t.nodes.len(), 2);
        let t = parse("redis-cluster://127.0.0.1:7000").unwrap();
        assert!(t.kind == Kind::Cluster && !t.tls);
        let t = parse("redis-sentinel://s1:26379,s2:26379/mymaster").unwrap();
        assert!(
            t.kind
                == Kind::Sentinel {
                    master: "mymaster".into()
                }
        );
        assert_eq!(t.nodes.len(), 2);
        let t = parse("rediss-sentinel://u:p@s1:26379/mymaster/3").unwrap();
        assert!(t.tls);
        assert_eq!(t.db, 3);
        assert_eq!(t.password.as_deref(), Some("p"));
    }

    #[test]
    fn a_store_not_read_says_why_lists_the_forms_and_hides_the_password() {
        for (url, why) in [
            ("redis:/localhost:6379", "not memory and not a URL"),
            ("mem", "not memory and not a URL"),
            ("http://h:1", "unknown scheme \"http\""),
            ("redis://localhost", "is not HOST:PORT"),
            ("redis://localhost:http", "the port is not a number"),
            ("redis://a:1,b:2", "takes one HOST:PORT"),
            ("redis://h:1/x", "the database \"x\" is not a number"),
            ("redis-cluster://h:1/0", "a Cluster has no database"),
            ("redis-sentinel://h:1", "the master's name is missing"),
            ("rediss://h:1/#insecure", "no query or fragment"),
            ("redis://u:hunter2@h:x", "the port is not a number"),
            ("redis://u:%zz@h:1", "bad %-escape in the password"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
            assert!(e.contains(FORMS), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn redacted_hides_every_password_and_keeps_the_rest() {
        for (url, shown) in [
            ("memory", "memory"),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("rediss://rl:s3cret@h:6380", "rediss://rl:***@h:6380"),
            ("redis://:s3cret@h:6380", "redis://:***@h:6380"),
            ("redis://s3cret@h:6380", "redis://***@h:6380"),
            ("redis://u:p@ss/w:rd@h:1/2", "redis://u:***@h:1/2"),
            (
                "redis-sentinel://u:s3cret@a:1,b:2/m",
                "redis-sentinel://u:***@a:1,b:2/m",
            ),
            ("u:s3cret@h", "***"),
        ] {
            assert_eq!(redacted(url), shown);
        }
        assert!(!format!("{:?}", parse("redis://u:s3cret@h:1").unwrap()).contains("s3cret"));
    }

    #[test]
    fn auth_is_a_password_or_user_and_password() {
        assert_eq!(split_auth("s3cret"), (None, "s3cret".into()));
        assert_eq!(
            split_auth("rl:s3:cret"),
            (Some("rl".into()), "s3:cret".into())
        );
        assert_eq!(split_auth(":s3cret"), (None, "s3cret".into()));
    }
}
