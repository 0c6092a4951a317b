module github.com/idem-go/idem

go 1.26.0
