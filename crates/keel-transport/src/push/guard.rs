//! The SSRF guard: a webhook must be `http` or `https` and either match the operator's allow
//! list of push targets or, with no list, resolve only to public addresses (unless the
//! operator allows private targets).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use reqwest::Url;

/// One entry of a push-target allow list: which webhooks the operator lets push
/// notifications reach.
///
/// Parsed from text: an entry with `://` is a URL prefix (same scheme, host and port, and a
/// path under the prefix's path, segment by segment); an IP address or CIDR block
/// (`10.0.0.0/8`, `::1`) matches a target whose every resolved address lies in it; anything
/// else is a host name, matched exactly (case-insensitive) or, written `*.example.com`, with
/// any subdomain.
///
/// ```
/// use keel_transport::PushTarget;
/// let entry: PushTarget = "https://hooks.example.com/a2a/".parse().unwrap();
/// assert_eq!(entry.to_string(), "https://hooks.example.com/a2a/");
/// assert!("10.0.0.0/8".parse::<PushTarget>().is_ok());
/// assert!("*.example.com".parse::<PushTarget>().is_ok());
/// assert!("ftp://example.com/".parse::<PushTarget>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushTarget {
    /// Webhooks whose URL lies under this one.
    UrlPrefix(Url),
    /// Webhooks whose host resolves only into this block.
    Network(IpNet),
    /// Webhooks on this host name (a leading `*.`: on any of its subdomains).
    Host(String),
}

impl FromStr for PushTarget {
    type Err = String;

    fn from_str(entry: &str) -> Result<Self, String> {
        let entry = entry.trim();
        if entry.contains("://") {
            let url = Url::parse(entry).map_err(|e| format!("`{entry}` is not a URL: {e}"))?;
            if url.scheme() != "http" && url.scheme() != "https" {
                return Err(format!(
                    "`{entry}`: scheme `{}` is not http or https",
                    url.scheme()
                ));
            }
            if url.host_str().is_none() {
                return Err(format!("`{entry}` has no host"));
            }
            if url.query().is_some() || url.fragment().is_some() {
                return Err(format!("`{entry}`: a URL prefix has no query or fragment"));
            }
            return Ok(Self::UrlPrefix(url));
        }
        if let Ok(net) = entry.parse::<IpNet>() {
            return Ok(Self::Network(net.trunc()));
        }
        if let Ok(ip) = entry.parse::<IpAddr>() {
            return Ok(Self::Network(IpNet::from(ip)));
        }
        let name = entry.strip_prefix("*.").unwrap_or(entry);
        let valid = !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
        if !valid {
            return Err(format!(
                "`{entry}` is not a URL prefix (`https://host/path/`), an IP address or CIDR                  block (`10.0.0.0/8`), nor a host name (`hooks.example.com`, `*.example.com`)"
            ));
        }
        Ok(Self::Host(entry.to_ascii_lowercase()))
    }
}

impl fmt::Display for PushTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UrlPrefix(url) => f.write_str(url.as_str()),
            Self::Network(net) => write!(f, "{net}"),
            Self::Host(host) => f.write_str(host),
        }
    }
}

impl PushTarget {
    /// Whether `url` matches by its text: a URL prefix or a host name entry.
    fn matches_url(&self, url: &Url) -> bool {
        match self {
            Self::UrlPrefix(prefix) => {
                let prefix_path = prefix.path().trim_end_matches('/');
                prefix.scheme() == url.scheme()
                    && prefix.host() == url.host()
                    && prefix.port_or_known_default() == url.port_or_known_default()
                    && url
                        .path()
                        .strip_prefix(prefix_path)
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
            Self::Host(host) => url.host_str().is_some_and(|target| {
                let target = target.to_ascii_lowercase();
                match host.strip_prefix("*.") {
                    Some(parent) => target
                        .strip_suffix(parent)
                        .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
                    None => target == *host,
                }
            }),
            Self::Network(_) => false,
        }
    }
}

/// Which webhooks push notifications may reach: with an allow list, only the targets it
/// names (private ones included: the operator named them); without one, public addresses,
/// and private ones too when the operator allows them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TargetPolicy {
    /// Loopback, private and link-local addresses are allowed (without an allow list).
    pub allow_private: bool,
    /// When not empty, the only targets allowed.
    pub allowed: Vec<PushTarget>,
}

impl TargetPolicy {
    /// Private targets allowed or refused, no allow list.
    #[cfg(test)]
    fn private(allow_private: bool) -> Self {
        Self {
            allow_private,
            allowed: Vec::new(),
        }
    }
}

/// The SSRF guard at delivery: the parsed URL and the addresses it was checked against (the
/// request goes to those, so DNS rebinding is caught). Checked at every delivery.
pub(crate) async fn check_target(
    url: &str,
    policy: &TargetPolicy,
) -> Result<(Url, Vec<SocketAddr>), String> {
    check(url, policy, false).await
}

/// The SSRF guard when a config is stored: as [`check_target`], except that a host that
/// does not resolve yet is accepted (it may by the time there is something to deliver, and
/// each delivery checks it again).
pub(crate) async fn check_new_target(url: &str, policy: &TargetPolicy) -> Result<Url, String> {
    check(url, policy, true).await.map(|(url, _)| url)
}

async fn check(
    url: &str,
    policy: &TargetPolicy,
    defer_unresolved: bool,
) -> Result<(Url, Vec<SocketAddr>), String> {
    let url = Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(format!("scheme `{}` is not http or https", url.scheme()));
    }
    let port = url
        .port_or_known_default()
        .ok_or_else(|| "the URL has no port".to_owned())?;
    let listed = !policy.allowed.is_empty();
    if listed && policy.allowed.iter().any(|entry| entry.matches_url(&url)) {
        return Ok((url, Vec::new()));
    }
    // Only addresses can match from here on: with a list, its networks; without, the
    // public ranges.
    let networks: Vec<&IpNet> = policy
        .allowed
        .iter()
        .filter_map(|entry| match entry {
            PushTarget::Network(net) => Some(net),
            _ => None,
        })
        .collect();
    let not_listed = || {
        format!(
            "`{url}` is not in the operator's push target allow list ({})",
            policy
                .allowed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    if listed && networks.is_empty() {
        return Err(not_listed());
    }
    let addresses: Vec<SocketAddr> = match url.host_str().map(literal_ip) {
        None => return Err("the URL has no host".to_owned()),
        Some(Ok(ip)) => vec![SocketAddr::new(ip, port)],
        Some(Err(domain)) => {
            if policy.allow_private && !listed {
                return Ok((url.clone(), Vec::new()));
            }
            match tokio::net::lookup_host((domain, port)).await {
                Ok(found) => found.collect(),
                Err(_) if defer_unresolved => return Ok((url.clone(), Vec::new())),
                Err(e) => return Err(format!("host `{domain}` does not resolve: {e}")),
            }
        }
    };
    if addresses.is_empty() {
        return Err("the host resolves to no address".to_owned());
    }
    if listed {
        if addresses
            .iter()
            .any(|a| !networks.iter().any(|net| net.contains(&a.ip())))
        {
            return Err(not_listed());
        }
    } else if !policy.allow_private {
        if let Some(bad) = addresses.iter().find(|a| !is_public(a.ip())) {
            return Err(format!(
                "target address {} is loopback, private, link-local or otherwise not public; the operator has not allowed such push targets",
                bad.ip()
            ));
        }
    }
    Ok((url, addresses))
}

/// A URL host as an IP address (`[::1]` included), or the domain name it is.
pub(super) fn literal_ip(host: &str) -> Result<IpAddr, &str> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| host)
}

/// Whether an address is a public unicast address: one that no special-purpose registry sets
/// apart (see [`SPECIAL_V4`] and [`SPECIAL_V6`]). An IPv6 form that carries an IPv4 address
/// (IPv4-mapped, NAT64, 6to4) is as public as the address it carries.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => match embedded_v4(ip) {
            Some(v4) => is_public_v4(v4),
            None => {
                GLOBAL_UNICAST_V6.contains(&ip) && !SPECIAL_V6.iter().any(|net| net.contains(&ip))
            }
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    !SPECIAL_V4.iter().any(|net| net.contains(&ip))
}

/// The IPv4 address inside an IPv6 address that stands for it on the wire: IPv4-mapped
/// (`::ffff:0:0/96`, RFC 4291), the well-known NAT64 prefix (`64:ff9b::/96`, RFC 6052) and
/// 6to4 (`2002::/16`, RFC 3056, the address in bits 16 to 48).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let [s0, s1, s2, s3, s4, s5, s6, s7] = ip.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match (s0, s1, s2, s3, s4, s5) {
        (0, 0, 0, 0, 0, 0xffff) => Some(v4(s6, s7)),
        (0x64, 0xff9b, 0, 0, 0, 0) => Some(v4(s6, s7)),
        (0x2002, ..) => Some(v4(s1, s2)),
        _ => None,
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix)
}

/// IPv4 ranges that are not public targets: every entry of IANA's "IPv4 Special-Purpose
/// Address Registry" that is not globally reachable, or is for documentation or
/// benchmarking, plus multicast (IANA "IPv4 Multicast Address Space Registry") and the
/// reserved `240.0.0.0/4` (IANA "IPv4 Address Space Registry", which holds the limited
/// broadcast address).
const SPECIAL_V4: [Ipv4Net; 15] = [
    v4(0, 0, 0, 0, 8),       // "this network", RFC 791
    v4(10, 0, 0, 0, 8),      // private use, RFC 1918
    v4(100, 64, 0, 0, 10),   // shared address space (CGNAT), RFC 6598
    v4(127, 0, 0, 0, 8),     // loopback, RFC 1122
    v4(169, 254, 0, 0, 16),  // link local, RFC 3927 (cloud metadata services live here)
    v4(172, 16, 0, 0, 12),   // private use, RFC 1918
    v4(192, 0, 0, 0, 24),    // IETF protocol assignments, RFC 6890
    v4(192, 0, 2, 0, 24),    // documentation (TEST-NET-1), RFC 5737
    v4(192, 88, 99, 0, 24),  // 6to4 relay anycast (deprecated), RFC 7526
    v4(192, 168, 0, 0, 16),  // private use, RFC 1918
    v4(198, 18, 0, 0, 15),   // benchmarking, RFC 2544
    v4(198, 51, 100, 0, 24), // documentation (TEST-NET-2), RFC 5737
    v4(203, 0, 113, 0, 24),  // documentation (TEST-NET-3), RFC 5737
    v4(224, 0, 0, 0, 4),     // multicast, RFC 5771
    v4(240, 0, 0, 0, 4),     // reserved, RFC 1112; includes 255.255.255.255 (broadcast)
];

const fn v6(segments: [u16; 8], prefix: u8) -> Ipv6Net {
    let [a, b, c, d, e, f, g, h] = segments;
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), prefix)
}

/// IPv6 public targets lie in global unicast, `2000::/3` (IANA "IPv6 Global Unicast Address
/// Assignments"); everything outside it is loopback, unspecified, IPv4-compatible, reserved,
/// unique local (`fc00::/7`), link local (`fe80::/10`), site local (`fec0::/10`, deprecated)
/// or multicast (`ff00::/8`), and is refused (the IPv4-carrying forms aside, see
/// [`embedded_v4`]).
const GLOBAL_UNICAST_V6: Ipv6Net = v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// Ranges inside `2000::/3` that are not public targets, from IANA's "IPv6 Special-Purpose
/// Address Registry". 6to4 (`2002::/16`) is judged by the IPv4 address it carries.
const SPECIAL_V6: [Ipv6Net; 4] = [
    // IETF protocol assignments, RFC 2928: Teredo (`2001::/32`, which tunnels to any IPv4
    // address), benchmarking, ORCHID and a few anycast services; no webhook lives here.
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),
    v6([0x2001, 0x0db8, 0, 0, 0, 0, 0, 0], 32), // documentation, RFC 3849
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),      // documentation, RFC 9637
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16),      // segment routing (SRv6) SIDs, RFC 9602
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_private_link_local_and_friends_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            // IPv4-compatible, site local, 6to4 of loopback, NAT64 local use, Teredo,
            // documentation, multicast.
            "::127.0.0.1",
            "::8.8.8.8",
            "fec0::1",
            "2002:7f00:1::",
            "2002:a00:1::1",
            "64:ff9b:1::a00:1",
            "2001::1",
            "2001:db8::1",
            "3fff::1",
            "ff02::1",
            "192.0.2.1",
            "198.18.0.1",
            "240.0.0.1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2a00:1450:4001::1",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn the_guard_refuses_private_targets_unless_allowed() {
        for url in [
            "http://127.0.0.1:9/hook",
            "http://[::1]/hook",
            "http://169.254.169.254/latest/meta-data",
            "http://10.0.0.1/",
            "http://localhost:8080/hook",
            "http://[::127.0.0.1]/hook",
            "http://[fec0::1]/hook",
            "http://[2002:7f00:1::]/hook",
        ] {
            let err = check_target(url, &TargetPolicy::private(false))
                .await
                .unwrap_err();
            assert!(
                err.contains("not public") || err.contains("resolve"),
                "{url}: {err}"
            );
            assert!(
                check_target(url, &TargetPolicy::private(true))
                    .await
                    .is_ok(),
                "{url}"
            );
        }
        assert!(
            check_target("ftp://example.com/", &TargetPolicy::private(true))
                .await
                .is_err()
        );
        assert!(check_target("not a url", &TargetPolicy::private(true))
            .await
            .is_err());
        assert!(
            check_target("http://8.8.8.8/hook", &TargetPolicy::private(false))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_host_that_does_not_resolve_yet_is_stored_and_checked_at_delivery() {
        // `.invalid` never resolves (RFC 6761).
        let url = "https://hooks.example.invalid/a2a";
        assert!(check_new_target(url, &TargetPolicy::private(false))
            .await
            .is_ok());
        let err = check_target(url, &TargetPolicy::private(false))
            .await
            .unwrap_err();
        assert!(err.contains("does not resolve"), "{err}");
        // A name that resolves to a private address is still refused when stored.
        assert!(
            check_new_target("http://localhost:8080/hook", &TargetPolicy::private(false))
                .await
                .is_err()
        );
    }

    fn listed(entries: &[&str]) -> TargetPolicy {
        TargetPolicy {
            allow_private: false,
            allowed: entries.iter().map(|e| e.parse().unwrap()).collect(),
        }
    }

    #[tokio::test]
    async fn an_allow_list_admits_only_the_targets_it_names_private_ones_included() {
        // Names only: nothing is resolved, the URL decides.
        let names = listed(&[
            "https://hooks.example.com/a2a/",
            "*.corp.example",
            "api.example.org",
        ]);
        for url in [
            "https://hooks.example.com/a2a/task-1",
            "https://hooks.example.com:443/a2a/",
            "http://a.corp.example/hook",
            "https://API.example.org/x",
        ] {
            assert!(check_target(url, &names).await.is_ok(), "{url}");
        }
        for url in [
            "https://hooks.example.com/a2aevil",
            "https://hooks.example.com.evil.test/a2a/",
            "http://hooks.example.com/a2a/",
            "https://hooks.example.com:8443/a2a/",
            "http://corp.example/hook",
            "http://127.0.0.1/hook",
            "http://8.8.8.8/hook",
        ] {
            let err = check_target(url, &names).await.unwrap_err();
            assert!(err.contains("allow list"), "{url}: {err}");
        }
        // A network: every address must lie in it.
        let loopback = listed(&["127.0.0.0/8"]);
        assert!(check_target("http://127.0.0.1:9/hook", &loopback)
            .await
            .is_ok());
        for url in [
            "http://10.0.0.1/hook",
            "http://8.8.8.8/hook",
            "http://[::1]/hook",
        ] {
            let err = check_target(url, &loopback).await.unwrap_err();
            assert!(err.contains("allow list"), "{url}: {err}");
        }
        // The list decides even where the private switch is on.
        let mut with_private = listed(&["https://hooks.example.com/"]);
        with_private.allow_private = true;
        assert!(check_target("http://127.0.0.1/", &with_private)
            .await
            .is_err());
        // A prefix without a trailing slash still ends at a path segment.
        let exact = listed(&["https://hooks.example.com/a2a"]);
        assert!(check_target("https://hooks.example.com/a2a/x", &exact)
            .await
            .is_ok());
        assert!(check_target("https://hooks.example.com/a2ax", &exact)
            .await
            .is_err());
    }

    #[test]
    fn allow_list_entries_are_checked_when_read() {
        for bad in [
            "",
            "ftp://x/",
            "https://x/?q=1",
            "under_score.example",
            "a..b",
            "*.",
        ] {
            assert!(bad.parse::<PushTarget>().is_err(), "{bad}");
        }
        assert_eq!(
            "10.1.2.3/8".parse::<PushTarget>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!("::1".parse::<PushTarget>().unwrap().to_string(), "::1/128");
    }
}
