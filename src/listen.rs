//! Binding the daemon's ports (HTTP, the IntegreSQL API's, the PostgreSQL front's) before
//! postgres starts, so a taken port fails fast; and the PostgreSQL front's serve task.

/// The daemon's bound listeners.
pub struct Listeners {
    /// The HTTP API.
    pub http: tokio::net::TcpListener,
    /// The IntegreSQL API alone, if configured.
    pub integresql: Option<tokio::net::TcpListener>,
    /// The PostgreSQL front, if configured.
    pub front: Option<tokio::net::TcpListener>,
}

/// Binds the API's port and, if configured, the IntegreSQL API's and the PostgreSQL
/// front's; logs what failed.
pub async fn bind(config: &crate::cli::ServeConfig) -> Result<Listeners, ()> {
    let bind = |address: std::net::SocketAddr, what: &'static str| async move {
        tokio::net::TcpListener::bind(address)
            .await
            .map_err(|error| {
                tracing::error!(listen = %address, %error, "cannot listen for {what}");
            })
    };
    let http = bind(config.listen, "HTTP").await?;
    let integresql = match config.integresql_listen {
        Some(address) => Some(bind(address, "the IntegreSQL API").await?),
        None => None,
    };
    let front = match config.front_listen {
        Some(front) if front.chosen => Some(bind(front.address, "the PostgreSQL front").await?),
        // The default address: a daemon without its front beats no daemon.
        Some(front) => match tokio::net::TcpListener::bind(front.address).await {
            Ok(listener) => Some(listener),
            Err(error) => {
                tracing::warn!(
                    listen = %front.address,
                    %error,
                    "the PostgreSQL front's default address is not free; serving without the \
                     front (give --front-listen ADDR for another, or --front-listen off)"
                );
                None
            }
        },
        None => None,
    };
    Ok(Listeners {
        http,
        integresql,
        front,
    })
}

/// Serves the PostgreSQL front on `listener` until `stop` is cancelled, after saying where,
/// with what TLS, and how to try it. (The log line names the address `address=`, not
/// `addr=`, which the tests take for the HTTP API's; it is its last field.)
pub fn spawn_front(
    listener: tokio::net::TcpListener,
    front: pglease_front::FrontHandle,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let shown = local_address(&listener);
    let (host, port) = shown
        .map(|a| (a.ip().to_string(), a.port().to_string()))
        .unwrap_or_default();
    // What psql needs in its environment to get in.
    let mut env = String::new();
    if front.asks_password() {
        env.push_str("PGPASSWORD=\"$PGLEASE_TOKEN\" ");
    }
    let address = shown.map(|a| a.to_string()).unwrap_or_default();
    let mut tls = match front.tls() {
        None => "TLS off".to_owned(),
        Some(pglease_front::TlsSource::SelfSigned) => "TLS with a self-signed certificate".into(),
        Some(pglease_front::TlsSource::Files { cert, .. }) => {
            format!("TLS with the certificate {}", cert.display())
        }
    };
    if front.requires_tls() {
        tls.push_str(", required");
        env.push_str("PGSSLMODE=require ");
    }
    tracing::info!(
        %address,
        "PostgreSQL front listening on {address} ({tls}); try: {env}psql -h {host} -p {port} default"
    );
    tokio::spawn(pglease_front::serve(
        listener,
        front,
        stop.cancelled_owned(),
    ))
}

/// The bound address with an all-interfaces IP (0.0.0.0, ::) replaced by loopback, which a
/// client on this host can actually reach.
fn local_address(listener: &tokio::net::TcpListener) -> Option<std::net::SocketAddr> {
    let mut address = listener.local_addr().ok()?;
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Some(address)
}

/// The address to show in a "try it" hint: the bound one, with an all-interfaces IP
/// (0.0.0.0, ::) replaced by loopback, which a client on this host can actually reach.
pub fn local_url_base(listener: &tokio::net::TcpListener) -> String {
    local_address(listener)
        .map(|address| format!("http://{address}"))
        .unwrap_or_default()
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
