// A producer for bench/failover.py --client go: sends synchronously to one topic and prints a
// line per outcome ("ready" once the producer exists, "a" per acknowledged send, "e <error>"
// per failed one) until its standard input closes.
//
//	go run . <service-url> <topic>
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go run . <service-url> <topic>")
		os.Exit(2)
	}
	var stop atomic.Bool
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the end of the input is the signal
		stop.Store(true)
	}()
	logger := logrus.New()
	logger.SetOutput(os.Stderr)
	client, err := pulsar.NewClient(pulsar.ClientOptions{
		URL: os.Args[1], OperationTimeout: 30 * time.Second, Logger: plog.NewLoggerWithLogrus(logger),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	defer client.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{
		Topic: os.Args[2], DisableBatching: true, SendTimeout: 30 * time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
	defer producer.Close()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	_ = out.Flush()
	for !stop.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("x")})
		cancel()
		if err != nil {
			fmt.Fprintln(out, "e", strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Fprintln(out, "a")
		}
		_ = out.Flush()
	}
}
