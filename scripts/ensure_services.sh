#!/usr/bin/env bash
# Start the local services the test suite talks to, if they are not already answering.
# This machine kind starts them before a session; a clean machine may need them started again.
set -u
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if ! up 6379 && command -v redis-server >/dev/null; then
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! up 5672 && command -v rabbitmq-server >/dev/null; then
  rabbitmq-server -detached
fi
if ! up 5432 && command -v pg_ctlcluster >/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
fi
for port in 6379 5672 5432; do
  for _ in $(seq 1 60); do up "$port" && break; sleep 1; done
  up "$port" || echo "warning: nothing answers on 127.0.0.1:$port; tests needing it will fail" >&2
done
# RabbitMQ's management API (:15672), where queue depth reads in-flight counts and the lag: the plugin
# is enabled on the running node (once: enabling it again changes nothing), then waited for.
if up 5672 && ! up 15672 && command -v rabbitmq-plugins >/dev/null; then
  rabbitmq-plugins enable rabbitmq_management >/dev/null ||
    echo "warning: could not enable the rabbitmq_management plugin" >&2
  for _ in $(seq 1 60); do up 15672 && break; sleep 1; done
  up 15672 || echo "warning: RabbitMQ's management API does not answer on 127.0.0.1:15672; tests needing it will fail" >&2
fi
exit 0
