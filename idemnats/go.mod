module github.com/idem-go/idem/idemnats

go 1.26.0

require (
	github.com/idem-go/idem v0.1.0
	github.com/idem-go/idem/idemtest v0.1.0
	github.com/nats-io/nats.go v1.55.0
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	github.com/klauspost/compress v1.20.1 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
