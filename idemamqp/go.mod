module github.com/idem-go/idem/idemamqp

go 1.26.0

require (
	github.com/idem-go/idem v0.1.0
	github.com/idem-go/idem/idemtest v0.1.0
	github.com/rabbitmq/amqp091-go v1.16.0
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

require github.com/anishathalye/porcupine v1.3.1 // indirect
