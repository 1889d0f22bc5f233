# Both daemons in one image: grid-operatord (the default entrypoint) and grid-gatewayd
# (the gateway's Deployment sets its command). Built from this workspace, run as a
# non-root user on a distroless base (glibc and CA roots, no shell).
#   docker build -t grid .        or, engine-free:   buildah bud -t grid .
# Where the base images cannot be pulled, `bash .ci/image OUT` writes the same runtime
# image (an OCI layout, by umoci) from binaries built here; CI builds and runs it.
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p grid-operatord -p grid-gatewayd \
    && install -D -m 0755 -t /out target/release/grid-operatord target/release/grid-gatewayd

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 9443/tcp 9443/udp 9090/tcp 8080/tcp
ENTRYPOINT ["/usr/local/bin/grid-operatord"]
