# uvspan image: build stage runs the same setup script as the README, so what
# CI proves for scripts/setup.sh holds here.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY scripts/setup.sh scripts/setup.sh
RUN ./scripts/setup.sh --build
COPY . .
RUN cargo build --release --locked && strip target/release/uvspan

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libelf1 zlib1g ca-certificates >/dev/null \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/uvspan /usr/local/bin/uvspan
# Needs: hostPID (or a shared process namespace), /sys/kernel/btf, and
# CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE (CAP_DAC_READ_SEARCH recommended: other
# users' environment); no tracefs (see deploy/k8s/README.md).
ENTRYPOINT ["/usr/local/bin/uvspan"]
