//! Binding the daemon's HTTP ports, before postgres starts, so a taken port fails fast.

/// Binds the API's port and, if configured, the IntegreSQL API's; logs what failed.
pub async fn bind(
    config: &crate::cli::ServeConfig,
) -> Result<(tokio::net::TcpListener, Option<tokio::net::TcpListener>), ()> {
    let bind = |address: std::net::SocketAddr, what: &'static str| async move {
        tokio::net::TcpListener::bind(address)
            .await
            .map_err(|error| {
                tracing::error!(listen = %address, %error, "cannot listen for {what}");
            })
    };
    let main = bind(config.listen, "HTTP").await?;
    let integresql = match config.integresql_listen {
        Some(address) => Some(bind(address, "the IntegreSQL API").await?),
        None => None,
    };
    Ok((main, integresql))
}

/// The address to show in a "try it" hint: the bound one, with an all-interfaces IP
/// (0.0.0.0, ::) replaced by loopback, which a client on this host can actually reach.
pub fn local_url_base(listener: &tokio::net::TcpListener) -> String {
    let Ok(mut address) = listener.local_addr() else {
        return String::new();
    };
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{address}")
}

#[cfg(test)]
mod tests {
    use super::local_url_base;

    #[tokio::test]
    async fn an_all_interfaces_address_is_shown_as_loopback() {
        for (bind, shown) in [
            ("0.0.0.0:0", "http://127.0.0.1:"),
            ("[::]:0", "http://[::1]:"),
        ] {
            let Ok(listener) = tokio::net::TcpListener::bind(bind).await else {
                continue; // no IPv6 here
            };
            let url = local_url_base(&listener);
            assert!(url.starts_with(shown), "{bind} → {url}");
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert_eq!(
            local_url_base(&listener),
            format!("http://127.0.0.1:{port}")
        );
    }
}
