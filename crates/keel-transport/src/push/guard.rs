//! The SSRF guard: a webhook must be `http` or `https` and, unless the operator allows private
//! targets, resolve only to public addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;

/// The SSRF guard: the parsed URL and, unless private targets are allowed, the public
/// addresses its host resolves to (all of them must be public).
pub(crate) async fn check_target(
    url: &str,
    allow_private: bool,
) -> Result<(Url, Vec<SocketAddr>), String> {
    let url = Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(format!("scheme `{}` is not http or https", url.scheme()));
    }
    let port = url
        .port_or_known_default()
        .ok_or_else(|| "the URL has no port".to_owned())?;
    let addresses: Vec<SocketAddr> = match url.host_str().map(literal_ip) {
        None => return Err("the URL has no host".to_owned()),
        Some(Ok(ip)) => vec![SocketAddr::new(ip, port)],
        Some(Err(domain)) => {
            if allow_private {
                return Ok((url.clone(), Vec::new()));
            }
            tokio::net::lookup_host((domain, port))
                .await
                .map_err(|e| format!("host `{domain}` does not resolve: {e}"))?
                .collect()
        }
    };
    if addresses.is_empty() {
        return Err("the host resolves to no address".to_owned());
    }
    if !allow_private {
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

/// Whether an address is a public unicast address.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => {
            if let Some(v4) = ip.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let first = ip.segments()[0];
            // NAT64 (64:ff9b::/96) embeds an IPv4 address.
            if ip.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [.., a, b] = ip.segments();
                let [a1, a2] = a.to_be_bytes();
                let [b1, b2] = b.to_be_bytes();
                return is_public_v4(Ipv4Addr::new(a1, a2, b1, b2));
            }
            !(ip.is_loopback()
                || ip.is_unspecified()
                || ip.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local
                || (first & 0xffc0) == 0xfe80 // link-local
                || ip == Ipv6Addr::from([0u8; 16]))
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240)
}

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
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
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
        ] {
            let err = check_target(url, false).await.unwrap_err();
            assert!(
                err.contains("not public") || err.contains("resolve"),
                "{url}: {err}"
            );
            assert!(check_target(url, true).await.is_ok(), "{url}");
        }
        assert!(check_target("ftp://example.com/", true).await.is_err());
        assert!(check_target("not a url", true).await.is_err());
        assert!(check_target("http://8.8.8.8/hook", false).await.is_ok());
    }
}
