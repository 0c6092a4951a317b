module github.com/idem-go/idem/idemprobe

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/idem-go/idem v0.1.0
)
