module github.com/idem-go/idem/idemtest

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/idem-go/idem v0.1.0
	go.uber.org/goleak v1.3.0
)

require github.com/stretchr/testify v1.12.1 // indirect
