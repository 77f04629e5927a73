# PostgreSQL 15, Redis 7.0 and NATS 2.9 from Debian's packages, for `make container-test`
# (crmstack.containers runs one container of this image per server). No registry needed: the
# base is the image `make images` made with debootstrap, or any Debian bookworm image.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       postgresql redis-server nats-server >/dev/null \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
ENV PATH=/usr/lib/postgresql/15/bin:$PATH LANG=C.UTF-8
