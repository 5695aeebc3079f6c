# Sluice on Debian 12, built with the same scripts and packages as the tests build with
# (scripts/deps.sh build, scripts/build.sh build: tests/integration/test_stack.py checks it).

FROM debian:12 AS build
WORKDIR /src
COPY scripts/deps.sh scripts/deps.sh
RUN scripts/deps.sh build
COPY . .
RUN scripts/build.sh build

FROM debian:12-slim AS sluice
COPY scripts/deps.sh /tmp/deps.sh
RUN /tmp/deps.sh runtime && rm -rf /var/lib/apt/lists/* /tmp/deps.sh
COPY --from=build /src/build/sluice /usr/local/bin/sluice
COPY conf/docker/sluice.toml /etc/sluice/sluice.toml
USER nobody
EXPOSE 8080 9901
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["-c", "/etc/sluice/sluice.toml"]

# Valkey with the Sluice module (valkey-module/, built beside sluice): the compose stack's
# store, deciding with the module's SLUICE.* commands (README "Engines").
FROM valkey/valkey:8 AS valkey
COPY --from=build /src/build/sluice-valkey.so /usr/local/lib/sluice-valkey.so

# The demo upstream of the stack: the integration tests' upstream, served by Python.
FROM debian:12-slim AS demo
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    python3 && rm -rf /var/lib/apt/lists/*
COPY tests/integration/upstream.py /opt/demo/upstream.py
USER nobody
EXPOSE 9000
ENTRYPOINT ["python3", "/opt/demo/upstream.py", "--host", "0.0.0.0", "--port", "9000", "--strip-prefix", "/api"]
