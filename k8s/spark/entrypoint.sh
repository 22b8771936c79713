#!/usr/bin/env bash
# The pipeline image's entrypoint: Spark on Kubernetes' contract for its containers.
#
# Spark's Kubernetes scheduler (spark-submit --master k8s://..., or the spark-operator
# for it) starts the driver pod with the arguments `driver --properties-file FILE
# --class ... APP ARGS` and each executor pod with `executor`, its settings in the
# environment: SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, _CORES, _MEMORY, SPARK_APPLICATION_ID,
# SPARK_EXECUTOR_POD_IP, SPARK_RESOURCE_PROFILE_ID, SPARK_JAVA_OPT_0.. (the names are
# the constants of Spark's own org.apache.spark.deploy.k8s.Constants). Anything else is
# run as given (`spark-submit ...`, `txsync pipeline ...`, `bash`).
set -euo pipefail

case "${1:-}" in
driver)
    shift
    # The driver runs spark-submit in client mode inside its pod, bound to the pod's
    # address, which the executors are told (they dial the driver back).
    bind=()
    if [ -n "${SPARK_DRIVER_BIND_ADDRESS:-}" ]; then
        bind=(--conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS"
              --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS")
    fi
    exec "$SPARK_HOME/bin/spark-submit" "${bind[@]}" --deploy-mode client "$@"
    ;;
executor)
    shift
    # One -D or -X option per SPARK_JAVA_OPT_<n>, in n's order (a value may hold '=').
    java_options=()
    while IFS= read -r option; do
        java_options+=("$option")
    done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    classpath="${SPARK_CONF_DIR:-/opt/spark/conf}:$SPARK_HOME/jars/*${SPARK_CLASSPATH:+:$SPARK_CLASSPATH}"
    exec java "${java_options[@]}" \
        -Xms"${SPARK_EXECUTOR_MEMORY:?set by Spark}" -Xmx"$SPARK_EXECUTOR_MEMORY" \
        -cp "$classpath" org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
        --driver-url "${SPARK_DRIVER_URL:?set by Spark}" \
        --executor-id "${SPARK_EXECUTOR_ID:?set by Spark}" \
        --cores "${SPARK_EXECUTOR_CORES:?set by Spark}" \
        --app-id "${SPARK_APPLICATION_ID:?set by Spark}" \
        --hostname "${SPARK_EXECUTOR_POD_IP:?set by Spark}" \
        --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
        "$@"
    ;;
*)
    exec "$@"
    ;;
esac
