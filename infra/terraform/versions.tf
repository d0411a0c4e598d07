terraform {
  required_version = ">= 1.5.7"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 6.0, < 7.0"
    }
  }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = local.tags
  }
}

data "aws_caller_identity" "current" {}

locals {
  azs = [for s in var.az_suffixes : "${var.region}${s}"]
  tags = merge(var.tags, {
    project = "arl"
    cluster = var.cluster_name
  })
}
