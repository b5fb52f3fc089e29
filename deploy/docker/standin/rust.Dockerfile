# A local stand-in for the official rust:<version>-slim-bookworm image, for machines that
# reach no image registry (deploy/test.sh builds it only when that tag is missing). Same
# layout as the official image: a minimal-profile rustup toolchain in /usr/local/rustup,
# rustup and its proxies in /usr/local/cargo/bin, gcc and libc6-dev for linking. The build
# context (made by deploy/test.sh) holds rustup/ and cargo/, copied from the host's
# default stable toolchain.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ARG RUST_VERSION
ENV RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUST_VERSION=${RUST_VERSION}
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev; \
    rm -rf /var/lib/apt/lists/*
# The context's files are already world-writable, as the official image makes them: a chmod
# here would copy the whole toolchain into another layer.
COPY rustup /usr/local/rustup
COPY cargo /usr/local/cargo
RUN set -eux; \
    rustup --version; cargo --version; rustc --version; \
    rustc --version | grep -q "^rustc ${RUST_VERSION} "
